/*
 * Small commands: `kvferry config` lists every configuration key with its
 * effective value and help; `kvferry version` prints the version and the
 * build options.
 */
#include "tools/cli/cli.h"
#include "tools/cli/opts.h"

#include <kvferry/config.h>

#include <stdio.h>

static void kvf_config_print(const kvf_config_key_t *k, void *arg)
{
    (void)arg;
    printf("%-8s %-16s = %-14s %s (default %s)\n", k->component, k->name,
           k->value ? k->value : "", k->help, k->defval);
}

int kvf_cmd_config(int argc, char **argv)
{
    static const kvf_opt_t opts[] = {{0}};
    static const kvf_cmd_spec_t spec = {
        "kvferry config",
        "Lists every configuration key with its effective value, help and\n"
        "default.",
        opts};
    int rc = kvf_opts_parse(&spec, argc, argv, NULL);

    if (rc >= 0) {
        return rc;
    }
    printf("# every key can be set as KVF_<KEY> in the environment or as\n"
           "# 'key = value' in the file named by KVF_CONFIG\n");
    kvf_config_list(kvf_config_print, NULL);
    return KVF_CLI_OK;
}

int kvf_cmd_version(int argc, char **argv)
{
    static const kvf_opt_t opts[] = {{0}};
    static const kvf_cmd_spec_t spec = {
        "kvferry version", "Prints the version and the build options.", opts};
    int rc = kvf_opts_parse(&spec, argc, argv, NULL);

    if (rc >= 0) {
        return rc;
    }
    printf("kvferry %s\n", kvf_version());
#ifdef KVF_HAVE_CUDA
    printf("cuda: built\n");
#else
    printf("cuda: not built\n");
#endif
    return KVF_CLI_OK;
}
