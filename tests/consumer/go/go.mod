// SPDX-License-Identifier: Apache-2.0

module kvpageconsumer

go 1.19

require kvpage v0.0.0

replace kvpage => ../../../bindings/go
