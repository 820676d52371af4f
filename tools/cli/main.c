/*
 * kvferry: entry point of the command. Dispatches to the subcommands
 * listed in commands.c (target, bench ..., config, version, ...).
 */
#include "tools/cli/cli.h"

#include <signal.h>

#include <kvferry/config.h>

int main(int argc, char **argv)
{
    signal(SIGPIPE, SIG_IGN);
    kvf_cli_self = argv[0];
    if (kvf_config_check() > 0) {
        return KVF_CLI_USAGE;
    }
    return kvf_cli_dispatch(kvf_cli_commands, "kvferry", argc, argv);
}
