/* File-layer fault injection for the KV storage-fault suite (harness/kinds/kv/faults/inject.py).
 *
 * Loaded with LD_PRELOAD into an engine process (and inherited by the processes it starts). It
 * touches only the files named in HARNESS_FAULT_PATHS (absolute paths, one per line); every open
 * of one of them for reading is logged to HARNESS_FAULT_LOG ("<mode> <pid> <path>" per line) and,
 * by HARNESS_FAULT_MODE:
 *
 *   watch   the open goes through (the log proves the consumer read the damaged file);
 *   eio     the open fails with EIO (a read error on load);
 *   vanish  the file is unlinked, then the open goes through and fails with ENOENT (the file was
 *           removed after the connector's lookup found it and before its load).
 *
 * Opens for writing, and every other path, are passed through untouched.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int matches(const char *path) {
    const char *list = getenv("HARNESS_FAULT_PATHS");
    if (list == NULL || path == NULL || path[0] != '/')
        return 0;
    size_t n = strlen(path);
    const char *p = list;
    while (*p) {
        const char *end = strchr(p, '\n');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        if (len == n && strncmp(p, path, n) == 0)
            return 1;
        if (!end)
            break;
        p = end + 1;
    }
    return 0;
}

static void note(const char *mode, const char *path) {
    const char *log = getenv("HARNESS_FAULT_LOG");
    if (log == NULL)
        return;
    static int (*real_open)(const char *, int, ...) = NULL;
    if (real_open == NULL)
        real_open = (int (*)(const char *, int, ...))dlsym(RTLD_NEXT, "open");
    int fd = real_open(log, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0)
        return;
    char line[4600];
    int k = snprintf(line, sizeof line, "%s %d %s\n", mode, (int)getpid(), path);
    if (k > 0 && k < (int)sizeof line) {
        ssize_t w = write(fd, line, (size_t)k); /* one write: lines of several processes never mix */
        (void)w;
    }
    close(fd);
}

/* 0: pass through; -1 with errno set: fail the open. */
static int intercept(const char *path, int flags) {
    if ((flags & O_ACCMODE) != O_RDONLY || !matches(path))
        return 0;
    const char *mode = getenv("HARNESS_FAULT_MODE");
    if (mode == NULL)
        mode = "watch";
    note(mode, path);
    if (strcmp(mode, "eio") == 0) {
        errno = EIO;
        return -1;
    }
    if (strcmp(mode, "vanish") == 0)
        unlink(path);
    return 0;
}

#define MODE_ARG(flags, mode)                                                                     \
    mode_t mode = 0;                                                                              \
    if ((flags) & (O_CREAT | O_TMPFILE)) {                                                        \
        va_list ap;                                                                               \
        va_start(ap, flags);                                                                      \
        mode = (mode_t)va_arg(ap, int);                                                           \
        va_end(ap);                                                                               \
    }

#define OPEN_LIKE(name)                                                                           \
    int name(const char *path, int flags, ...) {                                                  \
        MODE_ARG(flags, mode)                                                                     \
        static int (*real)(const char *, int, ...) = NULL;                                       \
        if (real == NULL)                                                                         \
            real = (int (*)(const char *, int, ...))dlsym(RTLD_NEXT, #name);                     \
        if (intercept(path, flags) < 0)                                                           \
            return -1;                                                                            \
        return real(path, flags, mode);                                                           \
    }

#define OPENAT_LIKE(name)                                                                         \
    int name(int dirfd, const char *path, int flags, ...) {                                       \
        MODE_ARG(flags, mode)                                                                     \
        static int (*real)(int, const char *, int, ...) = NULL;                                  \
        if (real == NULL)                                                                         \
            real = (int (*)(int, const char *, int, ...))dlsym(RTLD_NEXT, #name);                \
        if (intercept(path, flags) < 0)                                                           \
            return -1;                                                                            \
        return real(dirfd, path, flags, mode);                                                    \
    }

OPEN_LIKE(open)
OPEN_LIKE(open64)
OPENAT_LIKE(openat)
OPENAT_LIKE(openat64)

FILE *fopen(const char *path, const char *how) {
    static FILE *(*real)(const char *, const char *) = NULL;
    if (real == NULL)
        real = (FILE * (*)(const char *, const char *)) dlsym(RTLD_NEXT, "fopen");
    if (how != NULL && how[0] == 'r' && strchr(how, '+') == NULL && intercept(path, O_RDONLY) < 0)
        return NULL;
    return real(path, how);
}

FILE *fopen64(const char *path, const char *how) {
    static FILE *(*real)(const char *, const char *) = NULL;
    if (real == NULL)
        real = (FILE * (*)(const char *, const char *)) dlsym(RTLD_NEXT, "fopen64");
    if (how != NULL && how[0] == 'r' && strchr(how, '+') == NULL && intercept(path, O_RDONLY) < 0)
        return NULL;
    return real(path, how);
}
