/*
 * Configuration tables, resolution from file and environment, and the
 * size/duration parsers used by every command-line flag.
 */
#include "core/config.h"
#include "core/log.h"

#include <ctype.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#define KVF_CONFIG_TABLES_MAX 32
#define KVF_CONFIG_FILE_MAX   128

static const kvf_config_table_t *kvf_config_tables[KVF_CONFIG_TABLES_MAX];
static size_t kvf_config_ntables;
static pthread_mutex_t kvf_config_lock = PTHREAD_MUTEX_INITIALIZER;

static struct {
    char key[64];
    char value[256];
} kvf_config_file[KVF_CONFIG_FILE_MAX];
static size_t kvf_config_nfile;
static int kvf_config_file_loaded;

void kvf_config_register(const kvf_config_table_t *table)
{
    size_t i;

    pthread_mutex_lock(&kvf_config_lock);
    for (i = 0; i < kvf_config_ntables; i++) {
        if (kvf_config_tables[i] == table) {
            goto out;
        }
    }
    if (kvf_config_ntables < KVF_CONFIG_TABLES_MAX) {
        kvf_config_tables[kvf_config_ntables++] = table;
    }
out:
    pthread_mutex_unlock(&kvf_config_lock);
}

static char *kvf_config_trim(char *s)
{
    char *e;

    while (isspace((unsigned char)*s)) {
        s++;
    }
    e = s + strlen(s);
    while (e > s && isspace((unsigned char)e[-1])) {
        *--e = '\0';
    }
    return s;
}

/* Loads KVF_CONFIG once; malformed lines are reported and skipped. */
static void kvf_config_load_file(void)
{
    const char *path = getenv("KVF_CONFIG");
    char line[512], *eq, *k, *v;
    FILE *f;
    int lineno = 0;

    if (kvf_config_file_loaded) {
        return;
    }
    kvf_config_file_loaded = 1;
    if (path == NULL || *path == '\0') {
        return;
    }
    f = fopen(path, "r");
    if (f == NULL) {
        kvf_error("cannot open config file %s: %m", path);
        return;
    }
    while (fgets(line, sizeof(line), f) != NULL) {
        lineno++;
        k = kvf_config_trim(line);
        if (*k == '#' || *k == '\0') {
            continue;
        }
        eq = strchr(k, '=');
        if (eq == NULL || kvf_config_nfile >= KVF_CONFIG_FILE_MAX) {
            kvf_error("%s:%d: expected 'key = value'", path, lineno);
            continue;
        }
        *eq = '\0';
        k = kvf_config_trim(k);
        v = kvf_config_trim(eq + 1);
        snprintf(kvf_config_file[kvf_config_nfile].key,
                 sizeof(kvf_config_file[0].key), "%s", k);
        snprintf(kvf_config_file[kvf_config_nfile].value,
                 sizeof(kvf_config_file[0].value), "%s", v);
        kvf_config_nfile++;
    }
    fclose(f);
}

const char *kvf_config_str(const kvf_config_table_t *table, const char *name)
{
    char env[96];
    const char *v;
    size_t i;

    kvf_config_register(table);
    snprintf(env, sizeof(env), "KVF_%s", name);
    for (i = 4; env[i] != '\0'; i++) {
        env[i] = (char)toupper((unsigned char)env[i]);
    }
    v = getenv(env);
    if (v != NULL && *v != '\0') {
        return v;
    }
    pthread_mutex_lock(&kvf_config_lock);
    kvf_config_load_file();
    pthread_mutex_unlock(&kvf_config_lock);
    for (i = 0; i < kvf_config_nfile; i++) {
        if (strcmp(kvf_config_file[i].key, name) == 0) {
            return kvf_config_file[i].value;
        }
    }
    for (i = 0; i < table->count; i++) {
        if (strcmp(table->entries[i].name, name) == 0) {
            return table->entries[i].defval;
        }
    }
    return NULL;
}

kvf_status_t kvf_config_u64(const kvf_config_table_t *table, const char *name,
                            uint64_t *value_p)
{
    const char *v = kvf_config_str(table, name);

    if (v == NULL) {
        kvf_error("unknown config key '%s'", name);
        return KVF_ERR_INVALID_PARAM;
    }
    if (kvf_parse_size(v, value_p) != KVF_OK) {
        kvf_error("config key '%s' has bad value '%s'", name, v);
        return KVF_ERR_INVALID_PARAM;
    }
    return KVF_OK;
}

void kvf_config_foreach(void (*fn)(const char *component,
                                   const kvf_config_entry_t *e,
                                   const char *value, void *arg),
                        void *arg)
{
    size_t t, i;

    for (t = 0; t < kvf_config_ntables; t++) {
        for (i = 0; i < kvf_config_tables[t]->count; i++) {
            const kvf_config_entry_t *e = &kvf_config_tables[t]->entries[i];

            fn(kvf_config_tables[t]->component, e,
               kvf_config_str(kvf_config_tables[t], e->name), arg);
        }
    }
}

int kvf_config_check_file(void)
{
    size_t f, t, i;
    int unknown = 0, found;

    pthread_mutex_lock(&kvf_config_lock);
    kvf_config_load_file();
    for (f = 0; f < kvf_config_nfile; f++) {
        found = 0;
        for (t = 0; t < kvf_config_ntables && !found; t++) {
            for (i = 0; i < kvf_config_tables[t]->count; i++) {
                if (strcmp(kvf_config_tables[t]->entries[i].name,
                           kvf_config_file[f].key) == 0) {
                    found = 1;
                    break;
                }
            }
        }
        if (!found) {
            kvf_error("config file %s: unknown key '%s' (see kvferry config)",
                      getenv("KVF_CONFIG"), kvf_config_file[f].key);
            unknown++;
        }
    }
    pthread_mutex_unlock(&kvf_config_lock);
    return unknown;
}

kvf_status_t kvf_parse_size(const char *text, uint64_t *bytes_p)
{
    char *end;
    double v;
    uint64_t mult = 1;

    if (text == NULL || *text == '\0') {
        return KVF_ERR_INVALID_PARAM;
    }
    errno = 0;
    v = strtod(text, &end);
    if (errno != 0 || end == text || v < 0) {
        return KVF_ERR_INVALID_PARAM;
    }
    while (*end == ' ') {
        end++;
    }
    switch (toupper((unsigned char)*end)) {
    case '\0':
        break;
    case 'K':
        mult = 1ull << 10;
        end++;
        break;
    case 'M':
        mult = 1ull << 20;
        end++;
        break;
    case 'G':
        mult = 1ull << 30;
        end++;
        break;
    case 'T':
        mult = 1ull << 40;
        end++;
        break;
    case 'B':
        break;
    default:
        return KVF_ERR_INVALID_PARAM;
    }
    if (strcasecmp(end, "") != 0 && strcasecmp(end, "B") != 0 &&
        strcasecmp(end, "iB") != 0) {
        return KVF_ERR_INVALID_PARAM;
    }
    if (v * (double)mult > 1.8e19) {
        return KVF_ERR_INVALID_PARAM;
    }
    *bytes_p = (uint64_t)(v * (double)mult + 0.5);
    return KVF_OK;
}

kvf_status_t kvf_parse_ms(const char *text, uint64_t *ms_p)
{
    char *end;
    double v;

    if (text == NULL || *text == '\0') {
        return KVF_ERR_INVALID_PARAM;
    }
    errno = 0;
    v = strtod(text, &end);
    if (errno != 0 || end == text || v < 0) {
        return KVF_ERR_INVALID_PARAM;
    }
    if (*end == '\0' || strcmp(end, "ms") == 0) {
        *ms_p = (uint64_t)v;
    } else if (strcmp(end, "s") == 0) {
        *ms_p = (uint64_t)(v * 1000.0);
    } else if (strcmp(end, "m") == 0 || strcmp(end, "min") == 0) {
        *ms_p = (uint64_t)(v * 60000.0);
    } else {
        return KVF_ERR_INVALID_PARAM;
    }
    return KVF_OK;
}

void kvf_fmt_size(uint64_t bytes, char *out, size_t outlen)
{
    static const char *units[] = {"B", "KB", "MB", "GB", "TB"};
    double v = (double)bytes;
    int u = 0;

    while (v >= 1024.0 && u < 4) {
        v /= 1024.0;
        u++;
    }
    snprintf(out, outlen, "%.1f %s", v, units[u]);
}
