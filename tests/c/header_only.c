/* SPDX-License-Identifier: Apache-2.0 */
/* The public header alone, compiled as strict C99. */
#include "kvpage/kvpage.h"

int main(void) { return kvp_get_api(KVP_ABI_MAJOR) == (const kvp_api*)0; }
