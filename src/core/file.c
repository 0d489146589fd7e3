/* Files: every path partrain reads or writes goes through here.
 *
 * Inputs: pt_file_open_regular, the one way every input path (config,
 * data, checkpoint files, state.json, `latest`) is opened, and whole small
 * text files (configs, checkpoint state) read through it into one
 * NUL-terminated buffer with a size cap, so that a wrong path (a model file
 * given as a config) fails with a message instead of eating memory, and a
 * NUL byte (which would silently cut the text short) is refused; and
 * a JSON text's "\u0000" escape, which cJSON decodes into the same NUL, is
 * found by pt_json_first_nul_escape for every JSON reader to refuse.
 *
 * Why one opener: open(2) of a FIFO for reading blocks until a writer
 * appears, so a FIFO given as data or config hung the run forever, and a
 * stat() before open() would still race with a rename. Opening with
 * O_NONBLOCK never blocks; fstat() on the descriptor then says what was
 * really opened, and anything but a regular file is refused by name.
 *
 * Outputs: an output path must be a regular file or nothing yet (a
 * checkpoint directory: a directory or nothing), in a folder that is one.
 * A file is written whole or not at all: pt_out writes a temporary beside
 * the target, checks every write (its stream records the first failed
 * write's errno, which stdio would lose), flushes and fsyncs it and renames
 * it over the target; any failure removes the temporary and is one line
 * naming the target ("plan.json: write failed: File too large"). Renaming
 * over a FIFO or a device would replace it with a regular file (as root,
 * `--write /dev/null` replaced /dev/null), and writing into one would block
 * or vanish, so the commands check every output path before any work
 * (pt_file_check_output, pt_dir_check_output) and pt_out checks again.
 * Streams written as they go (log.metrics' lines, which a user tails) open
 * through pt_file_open_output, regular files only, and check their writes
 * themselves. A file over RLIMIT_FSIZE fails with EFBIG only when SIGXFSZ
 * is ignored (main.c does, before anything else; ranks inherit it). */
#include "partrain/core.h"

#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdio_ext.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* "a directory", "a FIFO", "a regular file", ... for a file's mode. */
static const char *kind_of(mode_t m) {
    return S_ISREG(m)    ? "a regular file"
           : S_ISDIR(m)  ? "a directory"
           : S_ISFIFO(m) ? "a FIFO"
           : S_ISSOCK(m) ? "a socket"
           : S_ISCHR(m)  ? "a character device"
           : S_ISBLK(m)  ? "a block device"
                         : "of an unknown kind";
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

size_t pt_json_first_nul_escape(const char *s, size_t n) {
    /* every backslash of valid JSON is inside a string and starts an escape
     * of two characters or more: skipping two keeps "\\u0000" (an escaped
     * backslash, then text) apart from "\u0000" */
    for (size_t i = 0; i < n; i++)
        if (s[i] == '\\') {
            if (n - i >= 6 && !memcmp(s + i + 1, "u0000", 5)) return i;
            i++;
        }
    return n;
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

/* ---- outputs ---------------------------------------------------------------- */

/* The folder of path (malloc'd; NULL: out of memory): what comes before its
 * last '/', "." when there is none, "/" for "/x"; trailing slashes and
 * repeated ones do not count. */
static char *folder_of(const char *path) {
    size_t n = strlen(path);
    while (n > 1 && path[n - 1] == '/') n--;
    while (n > 0 && path[n - 1] != '/') n--;
    if (n == 0) return strdup(".");
    while (n > 1 && path[n - 1] == '/') n--;
    return strndup(path, n);
}

/* Where a file written to path lands (malloc'd): the file a symbolic link
 * names, so that the temporary goes beside it and the link stays; else
 * path itself. */
static char *target_of(const char *path) {
    struct stat sb;
    if (lstat(path, &sb) == 0 && S_ISLNK(sb.st_mode)) {
        char *real = realpath(path, NULL);
        if (real) return real;
    }
    return strdup(path);
}

/* The folder dir that will hold output `path` must be a directory this
 * process may write into. make_dirs: it may be missing as long as the
 * nearest folder above that exists is such a directory (the writer makes
 * the rest, as mkdir -p). */
static pt_status check_folder(const char *path, const char *dir, int make_dirs) {
    char *d = strdup(dir);
    pt_status st = d ? PT_OK : pt_error_set(PT_ERR_NOMEM, "%s: out of memory", path);
    while (st == PT_OK) {
        struct stat sb;
        if (stat(d, &sb) == 0) {
            if (!S_ISDIR(sb.st_mode)) /* ENOTDIR's words, then which file is in the way */
                st = pt_error_set(PT_ERR_IO, "%s: Not a directory (%s is %s)", path, d,
                                  kind_of(sb.st_mode));
            else if (access(d, W_OK | X_OK) != 0)
                st = pt_error_set(PT_ERR_IO, "%s: folder %s: %s", path, d, strerror(errno));
            break;
        }
        int err = errno;
        if (err == ENOENT && !make_dirs) {
            st = pt_error_set(PT_ERR_IO, "%s: folder %s does not exist", path, d);
        } else if (err != ENOENT && err != ENOTDIR) {
            st = pt_error_set(PT_ERR_IO, "%s: folder %s: %s", path, d, strerror(err));
        } else { /* missing (make_dirs), or a file above it: look one level up */
            char *up = folder_of(d);
            if (!up || !strcmp(up, d))
                st = pt_error_set(PT_ERR_IO, "%s: folder %s: %s", path, d, strerror(err));
            free(d);
            d = up;
        }
    }
    free(d);
    return st;
}

pt_status pt_file_check_output(const char *path, int make_dirs) {
    if (!path || !*path) return pt_error_set(PT_ERR_INVALID, "empty output path");
    size_t n = strlen(path);
    if (path[n - 1] == '/')
        return pt_error_set(PT_ERR_INVALID, "%s: names a folder (ends in '/'), not a file", path);
    struct stat sb;
    if (stat(path, &sb) == 0) {
        if (!S_ISREG(sb.st_mode))
            return pt_error_set(PT_ERR_IO, "%s: is %s, not a regular file", path,
                                kind_of(sb.st_mode));
    } else if (errno != ENOENT && errno != ENOTDIR) {
        return pt_error_set(PT_ERR_IO, "%s: %s", path, strerror(errno));
    }
    char *target = target_of(path), *dir = target ? folder_of(target) : NULL;
    pt_status st = dir ? check_folder(path, dir, make_dirs)
                       : pt_error_set(PT_ERR_NOMEM, "%s: out of memory", path);
    free(dir);
    free(target);
    return st;
}

pt_status pt_dir_check_output(const char *path) {
    if (!path || !*path) return pt_error_set(PT_ERR_INVALID, "empty output path");
    struct stat sb;
    if (stat(path, &sb) == 0) {
        if (!S_ISDIR(sb.st_mode))
            return pt_error_set(PT_ERR_IO, "%s: is %s, not a directory", path, kind_of(sb.st_mode));
        if (access(path, W_OK | X_OK) != 0)
            return pt_error_set(PT_ERR_IO, "%s: not writable: %s", path, strerror(errno));
        return PT_OK;
    }
    if (errno != ENOENT && errno != ENOTDIR)
        return pt_error_set(PT_ERR_IO, "%s: %s", path, strerror(errno));
    char *dir = folder_of(path);
    pt_status st =
        dir ? check_folder(path, dir, 1) : pt_error_set(PT_ERR_NOMEM, "%s: out of memory", path);
    free(dir);
    return st;
}

pt_status pt_file_open_output(const char *path, int append, FILE **out) {
    *out = NULL;
    PT_CHECK(pt_file_check_output(path, 0));
    /* O_NONBLOCK: a FIFO put there since the check must not block the open */
    int fd =
        open(path,
             O_WRONLY | O_CREAT | O_NONBLOCK | O_NOCTTY | O_CLOEXEC | (append ? O_APPEND : O_TRUNC),
             0666);
    struct stat sb;
    if (fd < 0 || fstat(fd, &sb) != 0) {
        int err = errno;
        if (fd >= 0) close(fd);
        if (stat(path, &sb) == 0 && !S_ISREG(sb.st_mode))
            return pt_error_set(PT_ERR_IO, "%s: is %s, not a regular file", path,
                                kind_of(sb.st_mode));
        return pt_error_set(PT_ERR_IO, "%s: %s", path, strerror(err));
    }
    int fl = S_ISREG(sb.st_mode) ? fcntl(fd, F_GETFL) : -1;
    FILE *f = fl >= 0 && fcntl(fd, F_SETFL, fl & ~O_NONBLOCK) == 0 ? fdopen(fd, append ? "a" : "w")
                                                                   : NULL;
    if (!f) {
        int err = errno;
        close(fd);
        if (!S_ISREG(sb.st_mode))
            return pt_error_set(PT_ERR_IO, "%s: is %s, not a regular file", path,
                                kind_of(sb.st_mode));
        return pt_error_set(PT_ERR_IO, "%s: %s", path, strerror(err));
    }
    *out = f;
    return PT_OK;
}

/* A whole output file on its way (pt_out_open .. pt_out_commit). */
struct pt_out {
    FILE *f;      /* over fd through out_write, which keeps the first failure */
    int fd;       /* the temporary, open for writing */
    int err;      /* errno of the first failed write; 0: none */
    int synced;   /* pt_out_sync succeeded: nothing more may be written */
    char *path;   /* as the caller gave it: what messages name */
    char *target; /* where it goes (a symbolic link's file) */
    char *tmp;    /* the temporary, in target's folder */
};

/* The stream's write (fopencookie): all of buf, or 0 with the errno kept.
 * stdio itself reports a failed flush only as EOF, its errno lost by the
 * time the caller looks (a later write, or fclose, overwrites it). */
static ssize_t out_write(void *cookie, const char *buf, size_t n) {
    pt_out *o = cookie;
    for (size_t done = 0; done < n;) {
        ssize_t w = write(o->fd, buf + done, n - done);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) {
            if (!o->err) o->err = w < 0 ? errno : EIO;
            return 0;
        }
        done += (size_t)w;
    }
    return (ssize_t)n;
}

/* Close and remove the temporary, free o. */
static void out_discard(pt_out *o) {
    if (o->f) {
        __fpurge(o->f); /* what is still buffered is not written */
        fclose(o->f);
    }
    if (o->fd >= 0) close(o->fd);
    if (o->tmp) unlink(o->tmp);
    free(o->path);
    free(o->target);
    free(o->tmp);
    free(o);
}

/* A fresh temporary beside o->target: "<folder>/.<name>.tmp<pid>.<n>",
 * created exclusively (never someone else's file, never a link). */
static pt_status out_create(pt_out *o) {
    static atomic_uint seq; /* several files at once in one process (threads) */
    char *dir = folder_of(o->target);
    const char *name = strrchr(o->target, '/');
    name = name ? name + 1 : o->target;
    if (!dir) return pt_error_set(PT_ERR_NOMEM, "%s: out of memory", o->path);
    pt_status st = PT_OK;
    for (int tries = 0; st == PT_OK && o->fd < 0; tries++) {
        free(o->tmp);
        o->tmp = NULL;
        if (asprintf(&o->tmp, "%s/.%s.tmp%d.%u", dir, name, (int)getpid(),
                     atomic_fetch_add(&seq, 1)) < 0) {
            o->tmp = NULL;
            st = pt_error_set(PT_ERR_NOMEM, "%s: out of memory", o->path);
            break;
        }
        o->fd = open(o->tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_NOCTTY | O_CLOEXEC, 0666);
        if (o->fd < 0 && (errno != EEXIST || tries == 100)) {
            st = pt_error_set(PT_ERR_IO, "%s: cannot create a temporary file in %s: %s", o->path,
                              dir, strerror(errno));
            free(o->tmp);
            o->tmp = NULL; /* not ours: not to be removed */
        }
    }
    free(dir);
    return st;
}

pt_status pt_out_open(pt_out **out, const char *path) {
    *out = NULL;
    PT_CHECK(pt_file_check_output(path, 0));
    pt_out *o = calloc(1, sizeof *o);
    if (!o) return pt_error_set(PT_ERR_NOMEM, "%s: out of memory", path);
    o->fd = -1;
    o->path = strdup(path);
    o->target = target_of(path);
    pt_status st = o->path && o->target ? out_create(o)
                                        : pt_error_set(PT_ERR_NOMEM, "%s: out of memory", path);
    struct stat sb; /* a file replaced keeps its permissions */
    if (st == PT_OK && stat(o->target, &sb) == 0 && S_ISREG(sb.st_mode))
        (void)fchmod(o->fd, sb.st_mode & 07777);
    if (st == PT_OK) {
        cookie_io_functions_t io = {.write = out_write};
        o->f = fopencookie(o, "w", io);
        if (!o->f || setvbuf(o->f, NULL, _IOFBF, 1 << 16) != 0)
            st = pt_error_set(PT_ERR_NOMEM, "%s: out of memory", path);
    }
    if (st != PT_OK) {
        out_discard(o);
        return st;
    }
    *out = o;
    return PT_OK;
}

FILE *pt_out_stream(pt_out *o) {
    return o->f;
}

pt_status pt_out_write(pt_out *o, const void *data, size_t n) {
    if (n == 0 || fwrite(data, 1, n, o->f) == n) return PT_OK;
    return pt_error_set(PT_ERR_IO, "%s: write failed: %s", o->path,
                        strerror(o->err ? o->err : EIO));
}

pt_status pt_out_sync(pt_out *o) {
    if (o->synced) return PT_OK;
    if (fflush(o->f) != 0 || ferror(o->f) || o->err)
        return pt_error_set(PT_ERR_IO, "%s: write failed: %s", o->path,
                            strerror(o->err ? o->err : EIO));
    if (fsync(o->fd) != 0)
        return pt_error_set(PT_ERR_IO, "%s: fsync: %s", o->path, strerror(errno));
    o->synced = 1;
    return PT_OK;
}

pt_status pt_out_commit(pt_out *o) {
    pt_status st = pt_out_sync(o);
    if (st == PT_OK) {
        fclose(o->f); /* nothing buffered: its fd is ours, closed below */
        o->f = NULL;
        int rc = close(o->fd);
        o->fd = -1;
        if (rc != 0) st = pt_error_set(PT_ERR_IO, "%s: write failed: %s", o->path, strerror(errno));
    }
    if (st == PT_OK && rename(o->tmp, o->target) != 0)
        st = pt_error_set(PT_ERR_IO, "%s: rename: %s", o->path, strerror(errno));
    if (st == PT_OK) {
        free(o->tmp);
        o->tmp = NULL; /* in place: nothing to remove */
    }
    out_discard(o);
    return st;
}

void pt_out_abort(pt_out *o) {
    if (o) out_discard(o);
}

pt_status pt_file_write_atomic(const char *path, const void *data, size_t n) {
    pt_out *o = NULL;
    PT_CHECK(pt_out_open(&o, path));
    pt_status st = pt_out_write(o, data, n);
    if (st != PT_OK) {
        pt_out_abort(o);
        return st;
    }
    return pt_out_commit(o);
}
