/* SPDX-License-Identifier: Apache-2.0 */
/* Links against an installed kvpage and creates a cache. */
#include <kvpage/kvpage.h>
#include <stdio.h>
#include <string.h>

int main(void) {
  kvp_cache_config cfg;
  kvp_cache* cache = NULL;
  kvp_error* err;
  kvp_cache_config_init(&cfg);
  cfg.num_blocks = 4;
  cfg.num_kv_heads = 1;
  err = kvp_cache_create(&cfg, &cache);
  if (err != NULL) {
    fprintf(stderr, "%s\n", kvp_error_message(err));
    kvp_error_free(err);
    return 1;
  }
  kvp_cache_destroy(cache);
  if (strcmp(kvp_version_string(), KVP_VERSION_STRING) != 0) return 1;
  printf("consumer: kvpage %s\n", kvp_version_string());
  return 0;
}
