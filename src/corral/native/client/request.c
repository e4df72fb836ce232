/*
 * client/request.c: what a request carries besides its own members - the
 * environment as Python's os.environ would hold it (and whether this program
 * can reproduce it), the code stamp, cwd and pid.
 */
#define _GNU_SOURCE
#include <langinfo.h>
#include <limits.h>
#include <locale.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "client.h"

/* ---------------------------------------------------------------- the environment */
/* The LC_CTYPE value the Python CLI would set in its own environment when the
 * locale is "C" (PEP 538 coercion: os.environ then has it), or NULL. */
const char *cl_coerced_ctype(void) {
    setlocale(LC_CTYPE, ""); /* what Python's start-up does first */
    const char *all = getenv("LC_ALL");
    if (all && *all)
        return NULL;
    const char *current = setlocale(LC_CTYPE, NULL);
    if (!current || strcmp(current, "C") != 0)
        return NULL;
    static const char *const targets[] = {"C.UTF-8", "C.utf8", "UTF-8"};
    for (size_t i = 0; i < sizeof targets / sizeof targets[0]; i++) {
        if (setlocale(LC_CTYPE, targets[i])) {
            const char *codeset = nl_langinfo(CODESET);
            if (codeset && *codeset)
                return targets[i];
            setlocale(LC_CTYPE, "");
        }
    }
    setlocale(LC_CTYPE, "C");
    return NULL;
}

/* Whether the Python CLI's filesystem encoding would be UTF-8 (the only
 * encoding this program reproduces); call after cl_coerced_ctype(). */
int cl_python_decodes_utf8(const char *coerced) {
    const char *utf8 = getenv("PYTHONUTF8");
    if (getenv("PYTHONCOERCECLOCALE"))
        return 0; /* its warnings and opt-outs: the Python CLI's business */
    if (utf8 && strcmp(utf8, "1") == 0)
        return 1;
    if (utf8 && strcmp(utf8, "0") != 0)
        return 0;
    if (coerced)
        return 1;
    const char *current = setlocale(LC_CTYPE, NULL);
    if (current && strcmp(current, "C") == 0)
        return !utf8; /* the C locale turns UTF-8 mode on, unless PYTHONUTF8=0 */
    const char *codeset = nl_langinfo(CODESET);
    return codeset && strcmp(codeset, "UTF-8") == 0;
}

static int key_is(const char *entry, size_t keylen, const char *name) {
    return strlen(name) == keylen && memcmp(entry, name, keylen) == 0;
}

/* The environment as Python's os.environ sees it: entries without '=' are
 * skipped, the first of duplicate names wins, LC_CTYPE coerced as above,
 * CORRAL_HANDOFF removed (the Python CLI pops it). */
static int put_environment(struct buf *b, const char *coerced) {
    size_t n = 0;
    while (environ[n])
        n++;
    /* first occurrence of each name: an open-addressing set of entry indices */
    size_t slots = 16;
    while (slots < 2 * n + 16)
        slots *= 2;
    size_t *table = calloc(slots, sizeof *table); /* index + 1; 0 = empty */
    if (!table)
        return -1;
    int ok = -1, first = 1, ctype_seen = 0;
    if (cl_buf_putc(b, '{') < 0)
        goto out;
    for (size_t i = 0; i < n; i++) {
        const char *entry = environ[i];
        const char *eq = strchr(entry, '=');
        if (!eq)
            continue;
        size_t keylen = (size_t)(eq - entry);
        uint64_t h = 1469598103934665603ULL;
        for (size_t j = 0; j < keylen; j++)
            h = (h ^ (unsigned char)entry[j]) * 1099511628211ULL;
        size_t slot = (size_t)h & (slots - 1);
        int duplicate = 0;
        while (table[slot]) {
            const char *other = environ[table[slot] - 1];
            if (strncmp(other, entry, keylen) == 0 && other[keylen] == '=') {
                duplicate = 1;
                break;
            }
            slot = (slot + 1) & (slots - 1);
        }
        if (duplicate)
            continue;
        table[slot] = i + 1;
        if (key_is(entry, keylen, HANDOFF))
            continue;
        const char *value = eq + 1;
        if (coerced && key_is(entry, keylen, "LC_CTYPE")) {
            value = coerced;
            ctype_seen = 1;
        }
        if ((!first && cl_buf_putc(b, ',') < 0) ||
            cl_put_json_bytes(b, (const unsigned char *)entry, keylen) < 0 || cl_buf_putc(b, ':') < 0 ||
            cl_put_json_str(b, value) < 0)
            goto out;
        first = 0;
    }
    if (coerced && !ctype_seen &&
        ((!first && cl_buf_putc(b, ',') < 0) || cl_put_json_str(b, "LC_CTYPE") < 0 ||
         cl_buf_putc(b, ':') < 0 || cl_put_json_str(b, coerced) < 0))
        goto out;
    ok = cl_buf_putc(b, '}');
out:
    free(table);
    return ok;
}

/* ---------------------------------------------------------------- request frames */
/* The frame's length placeholder and its first members: op, protocol, code. */
int cl_put_common(struct buf *b, const char *op) {
    char exe[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n < 0)
        return -1;
    exe[n] = 0;
    char head[64];
    snprintf(head, sizeof head, "{\"op\":\"%s\",\"protocol\":%d,\"code\":", op, PROTOCOL);
    if (cl_buf_put(b, "\0\0\0\0", 4) < 0 || cl_buf_puts(b, head) < 0)
        return -1;
    /* the stamp: "c1:" + this executable's path, as one JSON string */
    if (cl_buf_puts(b, "\"c1:") < 0 || cl_put_json_chars(b, (const unsigned char *)exe, (size_t)n) < 0)
        return -1;
    return cl_buf_putc(b, '"');
}

/* cwd, env and pid: the members every request ends with. */
int cl_put_cwd_env_pid(struct buf *b, const char *coerced) {
    char *cwd = getcwd(NULL, 0);
    if (!cwd)
        return -1;
    int ok = cl_buf_puts(b, ",\"cwd\":") < 0 || cl_put_json_str(b, cwd) < 0 ? -1 : 0;
    free(cwd);
    char pid[48];
    snprintf(pid, sizeof pid, ",\"pid\":%ld}", (long)getpid());
    if (ok < 0 || cl_buf_puts(b, ",\"env\":") < 0 || put_environment(b, coerced) < 0 ||
        cl_buf_puts(b, pid) < 0)
        return -1;
    return 0;
}
