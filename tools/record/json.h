/*
 * The JSON writer of bench output and records, on jansson: callers open
 * objects and arrays, add members and close them in order; closing the
 * outermost container writes the document (json.c).
 */
#ifndef KVF_TOOLS_JSON_H
#define KVF_TOOLS_JSON_H
#if !defined(KVF_LAYER_TOOLS) && !defined(KVF_TEST_INTERNALS)
#error "tools/record/json.h is private to tools/"
#endif

#include <jansson.h>
#include <stdio.h>

#define KVF_JSON_DEPTH 16

typedef struct kvf_json {
    FILE *f;
    int depth;
    json_t *stack[KVF_JSON_DEPTH]; /* open containers, outermost first */
} kvf_json_t;

/* The --json destination: path, or stdout for "-"; NULL (and a message)
 * when it cannot be opened. kvf_json_file_close closes it unless stdout. */
FILE *kvf_json_file_open(const char *path);
void kvf_json_file_close(FILE *f);

void kvf_json_begin(kvf_json_t *j, FILE *f);
void kvf_json_obj(kvf_json_t *j, const char *key); /* key NULL in arrays */
void kvf_json_arr(kvf_json_t *j, const char *key);
void kvf_json_end_obj(kvf_json_t *j);
void kvf_json_end_arr(kvf_json_t *j);
void kvf_json_str(kvf_json_t *j, const char *key, const char *v);
void kvf_json_num(kvf_json_t *j, const char *key, double v);
void kvf_json_int(kvf_json_t *j, const char *key, long long v);
void kvf_json_bool(kvf_json_t *j, const char *key, int v);
/* A value given as JSON text (an object, array or scalar); -1 when the
 * text is not JSON. */
int kvf_json_raw(kvf_json_t *j, const char *key, const char *text);

#endif
