/*
 * Configuration keys of the library, as `kvferry config` lists them. A
 * key is set in the environment as KVF_<KEY> (upper case) or in the file
 * named by KVF_CONFIG as "key = value"; command-line flags override both.
 * Keys come in three groups: user keys (the few a user has a reason to
 * set), tuning keys (performance knobs with measured defaults) and debug
 * keys (fault injection, diagnostics and experiment dials; hidden unless
 * asked for).
 */
#ifndef KVFERRY_CONFIG_H
#define KVFERRY_CONFIG_H

#include <kvferry/status.h>

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum kvf_config_group {
    KVF_CONFIG_USER = 1,
    KVF_CONFIG_TUNING = 2,
    KVF_CONFIG_DEBUG = 3,
} kvf_config_group_t;

typedef struct kvf_config_key {
    const char *component; /* "engine", "store", ... */
    const char *name;      /* lower case, e.g. "transports" */
    const char *value;     /* effective value (default < file < env) */
    const char *defval;
    const char *help;
    kvf_config_group_t group;
} kvf_config_key_t;

/* The value forms every command and key accepts. */
/* "8G", "8GB", "8GiB", "512k", "4096" -> bytes (binary multiples). */
KVF_API kvf_status_t kvf_parse_size(const char *text, uint64_t *bytes_p);

/* "500ms", "3s", "2m", "100" (ms) -> milliseconds. */
KVF_API kvf_status_t kvf_parse_ms(const char *text, uint64_t *ms_p);

/* Formats bytes the way seed 000 prints them: "8.0 KB", "16.0 MB",
 * "1.0 GB" (binary multiples). */
KVF_API void kvf_fmt_size(uint64_t bytes, char *out, size_t outlen);

/* The effective value of a key (without command-line flags), or NULL
 * when no library component declares that key. */
KVF_API const char *kvf_config_get(const char *name);

/* Calls fn for every key, grouped by component in a fixed order. */
KVF_API void kvf_config_keys(void (*fn)(const kvf_config_key_t *key, void *arg),
                             void *arg);

/* An environment variable that is not a key: a file name, what a test
 * harness hands to the programs it starts, the Python package's own
 * locators. `kvferry config --all` and docs/config.md list them. */
typedef struct kvf_config_var {
    const char *name;   /* "KVF_CONFIG", "KVFERRY_LIB", ... */
    const char *defval; /* what applies when unset ("" = nothing) */
    const char *help;
    const char *reader; /* who reads it: "library", "python", ... */
} kvf_config_var_t;

/* The value of a listed variable (its default when unset or empty), or
 * NULL when name is not listed: callers read such variables through
 * this, not getenv. */
KVF_API const char *kvf_config_var(const char *name);

/* Calls fn for every listed variable, in a fixed order. */
KVF_API void kvf_config_vars(void (*fn)(const kvf_config_var_t *var, void *arg),
                             void *arg);

/* Checks the configuration once per process: each KVF_* environment
 * variable that names no key is logged as a warning with the nearest key,
 * and each key of the KVF_CONFIG file that names no key as an error.
 * Returns the number of unknown keys in the file (callers refuse to run
 * when it is not 0). */
KVF_API int kvf_config_check(void);

#ifdef __cplusplus
}
#endif

#endif
