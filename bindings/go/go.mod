module kvpage

go 1.19
