/*
 * The log's settings from the config (keys log_level and log_file of the
 * core table): kvf_log_init, declared in core/log.h. Apart from log.c so
 * that the log does not depend on the config, which logs through it.
 */
#include "core/log.h"
#include "core/config.h"

void kvf_log_init(void)
{
    int level = kvf_log_level_parse(
        kvf_config_override(&kvf_core_config, "log_level"));

    kvf_log_to_file(kvf_config_override(&kvf_core_config, "log_file"));
    if (level >= 0) {
        kvf_log_set_level((kvf_log_level_t)level);
    }
}
