/*
 * Configuration: each component declares one table of keys (name, default,
 * help, group) with KVF_CONFIG_TABLE. A value is resolved as default <
 * config file (KVF_CONFIG names a file of "key = value" lines) <
 * environment (KVF_<KEY>, upper-cased) < explicit override (command-line
 * flag). This file's implementation is the only reader of the
 * environment in the library. Unknown keys in the file are errors,
 * unknown KVF_* environment variables warnings. Also size and duration
 * parsing ("8G", "64KiB", "500ms").
 */
#ifndef KVF_CORE_CONFIG_H
#define KVF_CORE_CONFIG_H
#if !defined(KVF_INTERNAL) && !defined(KVF_TEST_INTERNALS)
#error "core/config.h is internal to kvferry: use <kvferry/*.h>"
#endif

#include <kvferry/config.h>
#include <kvferry/status.h>

#include <stddef.h>
#include <stdint.h>

typedef struct kvf_config_entry {
    const char *name;   /* lower case, e.g. "tcp_conns" */
    const char *defval; /* default as text */
    const char *help;
    kvf_config_group_t group; /* user, tuning or debug */
} kvf_config_entry_t;

typedef struct kvf_config_table {
    const char *component;
    const kvf_config_entry_t *entries;
    size_t count;
} kvf_config_table_t;

/* Defines the table `var` of component `comp` from the array `entries`
 * and registers it when the program (or library) is loaded, so that
 * `kvferry config`, kvf_config_get and the unknown-key checks know every
 * key of the components linked in. */
#define KVF_CONFIG_TABLE(var, comp, entries)                                   \
    const kvf_config_table_t var = {comp, entries,                             \
                                    sizeof(entries) / sizeof((entries)[0])};   \
    __attribute__((constructor)) static void var##_register(void)              \
    {                                                                          \
        kvf_config_register(&var);                                             \
    }

/* Registers a table (KVF_CONFIG_TABLE does it at load time). Tables are
 * static; registration is idempotent. */
void kvf_config_register(const kvf_config_table_t *table);

/* Keys of core itself: log_level, and the debug keys the command reads. */
extern const kvf_config_table_t kvf_core_config;

/* Resolves a key's text value (file < env; the caller applies flags).
 * Returns the default when nothing overrides it. The first call checks
 * the environment for unknown KVF_* variables (kvf_config_check). */
const char *kvf_config_str(const kvf_config_table_t *table, const char *name);

/* $HOME (the system's, not a kvferry key): where per-user files such as
 * the automatic cluster secret live; NULL when unset. */
const char *kvf_config_home(void);

/* Like kvf_config_str, but NULL when neither the file nor the
 * environment sets the key. */
const char *kvf_config_override(const kvf_config_table_t *table,
                                const char *name);

kvf_status_t kvf_config_u64(const kvf_config_table_t *table, const char *name,
                            uint64_t *value_p);

/* Checks the KVF_CONFIG file against the registered tables: each key no
 * table knows is logged. Returns the number of unknown keys. */
int kvf_config_check_file(void);

/* Warns, once per process, about each KVF_* environment variable that
 * names no registered key, with the nearest key. */
void kvf_config_check_env(void);

/* Levenshtein distance between a and b, capped at 255. */
unsigned kvf_edit_distance(const char *a, const char *b);

#endif
