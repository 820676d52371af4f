/*
 * The public configuration calls (kvferry/config.h): every component's
 * table registered in one place, listed and read by component name. This
 * file sits in the top layer because it names the tables of all of them.
 */
#include <kvferry/config.h>

#include "core/config.h"
#include "core/log.h"
#include "store/proto/proto.h"
#include "transport/fault/fault.h"

#include <string.h>

extern const kvf_config_table_t kvf_engine_config;
extern const kvf_config_table_t kvf_cuda_config;

static const kvf_config_table_t *kvf_config_tables(size_t i)
{
    static const kvf_config_table_t *const tables[] = {
        &kvf_engine_config,
        &kvf_fault_config,
        &kvf_cuda_config,
        &kvf_store_config,
    };

    return i < sizeof(tables) / sizeof(tables[0]) ? tables[i] : NULL;
}

int kvf_config_init(void)
{
    const kvf_config_table_t *t;
    size_t i;

    kvf_log_init();
    for (i = 0; (t = kvf_config_tables(i)) != NULL; i++) {
        kvf_config_register(t);
    }
    return kvf_config_check_file();
}

typedef struct kvf_config_list_arg {
    void (*fn)(const kvf_config_key_t *key, void *arg);
    void *arg;
} kvf_config_list_arg_t;

static void kvf_config_list_one(const char *component,
                                const kvf_config_entry_t *e, const char *value,
                                void *arg)
{
    const kvf_config_list_arg_t *a = arg;
    kvf_config_key_t k = {component, e->name, value, e->defval, e->help};

    a->fn(&k, a->arg);
}

void kvf_config_list(void (*fn)(const kvf_config_key_t *key, void *arg),
                     void *arg)
{
    kvf_config_list_arg_t a = {fn, arg};
    const kvf_config_table_t *t;
    size_t i;

    if (fn == NULL) {
        return;
    }
    for (i = 0; (t = kvf_config_tables(i)) != NULL; i++) {
        kvf_config_register(t);
    }
    kvf_config_foreach(kvf_config_list_one, &a);
}

const char *kvf_config_get(const char *component, const char *name)
{
    const kvf_config_table_t *t;
    size_t i, k;

    if (component == NULL || name == NULL) {
        return NULL;
    }
    for (i = 0; (t = kvf_config_tables(i)) != NULL; i++) {
        if (strcmp(t->component, component) != 0) {
            continue;
        }
        for (k = 0; k < t->count; k++) {
            if (strcmp(t->entries[k].name, name) == 0) {
                return kvf_config_str(t, name);
            }
        }
    }
    return NULL;
}
