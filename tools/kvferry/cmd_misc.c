/*
 * Small commands: `kvferry config` lists every configuration key with its
 * effective value and help; `kvferry version` prints the version and the
 * build options.
 */
#include "tools/kvferry/cli.h"

#include <kvferry/config.h>

#include <stdio.h>
#include <string.h>

typedef struct {
    kvf_config_group_t group;
    int n;
} kvf_config_print_t;

static void kvf_config_print(const kvf_config_key_t *k, void *arg)
{
    kvf_config_print_t *p = arg;

    if (k->group != p->group) {
        return;
    }
    p->n++;
    printf("%-8s %-16s = %-14s %s (default %s)\n", k->component, k->name,
           k->value ? k->value : "", k->help, k->defval);
}

void kvf_cli_config_init(void)
{
    /* every library table registers itself when the program loads */
}

int kvf_cmd_config(int argc, char **argv)
{
    static const char *const titles[] = {
        "", "# user keys: the ones a deployment sets\n",
        "\n# tuning keys: performance knobs with measured defaults\n",
        "\n# debug keys: fault injection, diagnostics, experiment dials\n"};
    kvf_config_print_t p;
    int all = argc > 1 && strcmp(argv[1], "--all") == 0;
    int g;

    if (argc > 1 && !all) {
        int help = strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0;

        fprintf(help ? stdout : stderr,
                "usage: kvferry config [--all]\n"
                "  --all  also the debug keys (fault injection, diagnostics, "
                "experiment dials)\n");
        return help ? KVF_CLI_OK : KVF_CLI_USAGE;
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
        p.n = 0;
        printf("%s", titles[g]);
        kvf_config_keys(kvf_config_print, &p);
    }
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
