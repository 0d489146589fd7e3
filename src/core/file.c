/* Input files: pt_file_open_regular, the one way every input path (config,
 * data, checkpoint files, state.json, `latest`) is opened, and whole small
 * text files (configs, checkpoint state) read through it into one
 * NUL-terminated buffer with a size cap, so that a wrong path (a model file
 * given as a config) fails with a message instead of eating memory, and a
 * NUL byte (which would silently cut the text short) is refused.
 *
 * Why one opener: open(2) of a FIFO for reading blocks until a writer
 * appears, so a FIFO given as data or config hung the run forever, and a
 * stat() before open() would still race with a rename. Opening with
 * O_NONBLOCK never blocks; fstat() on the descriptor then says what was
 * really opened, and anything but a regular file is refused by name.
 *
 * Not here: output files (a metrics path may well be a FIFO or /dev/stdout;
 * writers check their own writes). */
#include "partrain/core.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* "a directory", "a FIFO", ... for the mode of something that is not a
 * regular file. */
static const char *kind_of(mode_t m) {
    return S_ISDIR(m)    ? "a directory"
           : S_ISFIFO(m) ? "a FIFO"
           : S_ISSOCK(m) ? "a socket"
           : S_ISCHR(m)  ? "a character device"
           : S_ISBLK(m)  ? "a block device"
                         : "not a regular file";
}

pt_status pt_file_open_regular(const char *path, FILE **out, uint64_t *size) {
    *out = NULL;
    if (size) *size = 0;
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
    if (fd < 0) {
        int err = errno;
        struct stat sb; /* a socket cannot be opened (ENXIO): say what it is */
        if (stat(path, &sb) == 0 && !S_ISREG(sb.st_mode))
            return pt_error_set(PT_ERR_IO, "%s: is %s, not a regular file", path,
                                kind_of(sb.st_mode));
        return pt_error_set(PT_ERR_IO, "%s: %s", path, strerror(err));
    }
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        int err = errno;
        close(fd);
        return pt_error_set(PT_ERR_IO, "%s: %s", path, strerror(err));
    }
    if (!S_ISREG(sb.st_mode)) {
        close(fd);
        return pt_error_set(PT_ERR_IO, "%s: is %s, not a regular file", path, kind_of(sb.st_mode));
    }
    /* blocking reads from here on (O_NONBLOCK means nothing for regular
     * files on Linux, but the stream should not depend on that) */
    int fl = fcntl(fd, F_GETFL);
    if (fl < 0 || fcntl(fd, F_SETFL, fl & ~O_NONBLOCK) != 0) {
        int err = errno;
        close(fd);
        return pt_error_set(PT_ERR_IO, "%s: %s", path, strerror(err));
    }
    FILE *f = fdopen(fd, "rb");
    if (!f) {
        int err = errno;
        close(fd);
        return pt_error_set(PT_ERR_IO, "%s: %s", path, strerror(err));
    }
    if (size) *size = (uint64_t)sb.st_size;
    *out = f;
    return PT_OK;
}

pt_status pt_read_text_file(const char *path, size_t max_bytes, char **out) {
    *out = NULL;
    FILE *f = NULL;
    PT_CHECK(pt_file_open_regular(path, &f, NULL));
    char *text = NULL;
    size_t len = 0, cap = 0;
    pt_status st = PT_OK;
    for (;;) {
        if (len + 4096 + 1 > cap) {
            cap = cap ? cap * 2 : 8192;
            char *t = realloc(text, cap);
            if (!t) {
                st = pt_error_set(PT_ERR_NOMEM, "%s: out of memory", path);
                break;
            }
            text = t;
        }
        size_t n = fread(text + len, 1, 4096, f);
        len += n;
        if (len > max_bytes) {
            st = pt_error_set(PT_ERR_FORMAT, "%s: larger than %zu bytes", path, max_bytes);
            break;
        }
        if (n < 4096) break;
    }
    if (st == PT_OK && ferror(f)) st = pt_error_set(PT_ERR_IO, "%s: read error", path);
    fclose(f);
    if (st != PT_OK) {
        free(text);
        return st;
    }
    /* a NUL would end the text early and hide the rest from the parser */
    const char *nul = memchr(text, '\0', len);
    if (nul) {
        pt_status bad = pt_error_set(PT_ERR_FORMAT, "%s: NUL byte at offset %zu: not a text file",
                                     path, (size_t)(nul - text));
        free(text);
        return bad;
    }
    text[len] = '\0';
    *out = text;
    return PT_OK;
}
