/*
 * kvferry configuration, as a program sees it: every component (engine,
 * fault, cuda, store) has a table of keys; a key's value comes from its
 * default, the file KVF_CONFIG names ("key = value" lines), or the
 * environment (KVF_<KEY>), the later winning. `kvferry config` prints
 * this list.
 *
 *   if (kvf_config_init() > 0) { ...unknown keys in the file... }
 *   kvf_config_list(print_key, NULL);
 *   const char *m = kvf_config_get("store", "master");
 */
#ifndef KVFERRY_CONFIG_H
#define KVFERRY_CONFIG_H

#include <kvferry/status.h>

#ifdef __cplusplus
extern "C" {
#endif

/* One key as kvf_config_list() reports it; the strings stay valid for
 * the process's life (value: until the environment changes). */
typedef struct kvf_config_key {
    const char *component; /* "engine", "fault", "cuda", "store" */
    const char *name;      /* lower case, e.g. "tcp_conns" */
    const char *value;     /* effective value as text */
    const char *defval;    /* default as text */
    const char *help;
} kvf_config_key_t;

/* Prepares the process: logging as the environment asks, and every
 * component's table known, so the KVF_CONFIG file can be checked.
 * Returns the number of keys in that file no table knows (each logged);
 * a command should refuse to run when it is not zero. */
KVF_API int kvf_config_init(void);

/* Calls fn for every key of every component, in table order. */
KVF_API void kvf_config_list(void (*fn)(const kvf_config_key_t *key, void *arg),
                             void *arg);

/* The effective value of component's key name as text; NULL when there
 * is no such key. */
KVF_API const char *kvf_config_get(const char *component, const char *name);

#ifdef __cplusplus
}
#endif

#endif
