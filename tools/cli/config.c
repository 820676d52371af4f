/*
 * Small commands: `kvferry config` lists every configuration key with its
 * effective value and help; `kvferry version` prints the version and the
 * build options.
 */
#include "tools/cli/cli.h"
#include "core/config.h"

#include <stdio.h>

extern const kvf_config_table_t kvf_engine_config;
extern const kvf_config_table_t kvf_fault_config;
extern const kvf_config_table_t kvf_cuda_config;
extern const kvf_config_table_t kvf_store_config;

static void kvf_config_print(const char *component, const kvf_config_entry_t *e,
                             const char *value, void *arg)
{
    (void)arg;
    printf("%-8s %-16s = %-14s %s (default %s)\n", component, e->name,
           value ? value : "", e->help, e->defval);
}

void kvf_cli_config_init(void)
{
    kvf_config_register(&kvf_engine_config);
    kvf_config_register(&kvf_fault_config);
    kvf_config_register(&kvf_cuda_config);
    kvf_config_register(&kvf_store_config);
}

int kvf_cmd_config(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    printf("# every key can be set as KVF_<KEY> in the environment or as\n"
           "# 'key = value' in the file named by KVF_CONFIG\n");
    kvf_config_foreach(kvf_config_print, NULL);
    return KVF_CLI_OK;
}

int kvf_cmd_version(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    printf("kvferry %s\n", kvf_version());
#ifdef KVF_HAVE_CUDA
    printf("cuda: built\n");
#else
    printf("cuda: not built\n");
#endif
    return KVF_CLI_OK;
}
