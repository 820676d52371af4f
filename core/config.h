/*
 * Configuration: each component declares one table of keys (name, default,
 * help). A value is resolved as default < config file (KVF_CONFIG names a
 * file of "key = value" lines) < environment (KVF_<KEY>, upper-cased) <
 * explicit override (command-line flag). Unknown keys in the file are
 * errors. Also size and duration parsing ("8G", "64KiB", "500ms").
 */
#ifndef KVF_CORE_CONFIG_H
#define KVF_CORE_CONFIG_H

#include <kvferry/status.h>

#include <stddef.h>
#include <stdint.h>

typedef struct kvf_config_entry {
    const char *name;   /* lower case, e.g. "tcp_conns" */
    const char *defval; /* default as text */
    const char *help;
} kvf_config_entry_t;

typedef struct kvf_config_table {
    const char *component;
    const kvf_config_entry_t *entries;
    size_t count;
} kvf_config_table_t;

/* Registers a table so `kvferry config` lists it and the config file
 * checker knows its keys. Tables are static; registration is idempotent. */
void kvf_config_register(const kvf_config_table_t *table);

/* Resolves a key's text value (file < env; the caller applies flags).
 * Returns the default when nothing overrides it. */
const char *kvf_config_str(const kvf_config_table_t *table, const char *name);

kvf_status_t kvf_config_u64(const kvf_config_table_t *table, const char *name,
                            uint64_t *value_p);

/* Calls fn for each registered key with its resolved value. */
void kvf_config_foreach(void (*fn)(const char *component,
                                   const kvf_config_entry_t *e,
                                   const char *value, void *arg),
                        void *arg);

/* Checks the KVF_CONFIG file against the registered tables: each key no
 * table knows is logged. Returns the number of unknown keys. */
int kvf_config_check_file(void);

/* "8G", "8GB", "8GiB", "512k", "4096" -> bytes (binary multiples). */
kvf_status_t kvf_parse_size(const char *text, uint64_t *bytes_p);

/* "500ms", "3s", "2m", "100" (ms) -> milliseconds. */
kvf_status_t kvf_parse_ms(const char *text, uint64_t *ms_p);

/* Formats bytes the way seed 000 prints them: "8.0 KB", "16.0 MB",
 * "1.0 GB" (binary multiples). */
void kvf_fmt_size(uint64_t bytes, char *out, size_t outlen);

#endif
