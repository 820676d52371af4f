/*
 * Small commands: `kvferry config` lists every configuration key with its
 * effective value and help; `kvferry version` prints the version and the
 * build options.
 */
#include "tools/cli/cli.h"
#include "tools/cli/opts.h"

#include <kvferry/config.h>

#include <stdio.h>

typedef struct {
    kvf_config_group_t group;
} kvf_config_print_t;

static void kvf_config_print(const kvf_config_key_t *k, void *arg)
{
    const kvf_config_print_t *p = arg;

    if (k->group != p->group) {
        return;
    }
    printf("%-8s %-16s = %-14s %s (default %s)\n", k->component, k->name,
           k->value ? k->value : "", k->help, k->defval);
}

int kvf_cmd_config(int argc, char **argv)
{
    static const char *const titles[] = {
        "", "# user keys: the ones a deployment sets\n",
        "\n# tuning keys: performance knobs with measured defaults\n",
        "\n# debug keys: fault injection, diagnostics, experiment dials\n"};
    static int all;
    static const kvf_opt_t opts[] = {
        {"all", 0, KVF_OPT_FLAG, &all, NULL,
         "also the debug keys (fault injection, diagnostics, experiment "
         "dials)"},
        {0}};
    static const kvf_cmd_spec_t spec = {
        "kvferry config [--all]",
        "Lists the configuration keys with their effective value, help and\n"
        "default: user keys first, then tuning keys; --all adds debug keys.",
        opts};
    kvf_config_print_t p;
    int rc = kvf_opts_parse(&spec, argc, argv, NULL);
    int g;

    if (rc >= 0) {
        return rc;
    }
    printf("# every key can be set as KVF_<KEY> in the environment or as\n"
           "# 'key = value' in the file named by KVF_CONFIG\n");
    for (g = KVF_CONFIG_USER; g <= KVF_CONFIG_DEBUG; g++) {
        if (g == KVF_CONFIG_DEBUG && !all) {
            printf("\n# debug keys: hidden, 'kvferry config --all' lists "
                   "them\n");
            break;
        }
        p.group = (kvf_config_group_t)g;
        printf("%s", titles[g]);
        kvf_config_keys(kvf_config_print, &p);
    }
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
