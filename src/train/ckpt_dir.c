/* The checkpoint directory protocol: how step directories come into being,
 * how `latest` names the newest, who may write the directory, and what is
 * removed.
 *
 * A save, step by step (the points are pt_ckpt_point, train_impl.h):
 *   begin     DIR/.tmp-step_N-PID, a fresh directory
 *   files     model, optimizer, state.json and rank files into it, each
 *             fsynced; then the directory itself
 *   in place  rename to DIR/step_N. When step_N exists (saved again after a
 *             resume at that step, which `latest` may name) the two swap
 *             atomically (renameat2 RENAME_EXCHANGE), so that step_N is a
 *             complete directory at every instant; the old copy, now under
 *             the temporary name, is removed after the directory's fsync.
 *             Where the file system cannot swap (EINVAL: NFS, some FUSE) the
 *             old copy moves aside to DIR/.old-step_N-PID first; a crash
 *             between the two renames leaves `latest` naming a missing
 *             directory, which pt_checkpoint_resolve answers with the .old
 *             copy and the next run's pt_ckpt_dir_open renames back.
 *   latest    DIR/.latest.tmp<pid>.<n> written and fsynced, renamed over
 *             latest (pt_out, as every file of a save)
 *   prune     checkpoint.keep: older step directories renamed to
 *             DIR/.del-step_N-PID (gone from view at once), then removed
 *
 * So a crash anywhere leaves `latest` naming a complete step directory (or,
 * on the fallback, one resolve finds) and only hidden leftovers, which the
 * next run removes before step 1. That is safe because of DIR/.lock: rank 0
 * holds an exclusive flock on it for the life of the trainer, so that no
 * other job writes or cleans the directory meanwhile, and a second job is
 * refused with the holder's pid.
 *
 * Not here: the files' formats (checkpoint.c, rank_state.c) and what goes
 * into them (trainer_ckpt.c). */
#include "train_impl.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#define PATH_MAX_CK (PT_CONFIG_STR_MAX + 64)

/* ---- test hooks ---- */

static int crash_point = -1; /* pt_ckpt_point at which to _exit, or -1 */
static int no_exchange;      /* 1: take the fallback path as if swapping were unsupported */

void pt_ckpt_test_hooks(int crash_at, int never_exchange) {
    crash_point = crash_at;
    no_exchange = never_exchange;
}

/* A crash (no cleanup, no atexit) when a test asked for one at this point. */
static void reached(pt_ckpt_point p) {
    if ((int)p == crash_point) _exit(PT_CKPT_CRASH_EXIT);
}

void pt_ckpt_reached(pt_ckpt_point p) {
    reached(p);
}

/* ---- small file helpers ---- */

static pt_status fsync_path(const char *path, int dir) {
    int fd = open(path, dir ? (O_RDONLY | O_DIRECTORY) : O_RDONLY);
    if (fd < 0) return pt_error_set(PT_ERR_IO, "%s: %s", path, strerror(errno));
    int rc = fsync(fd);
    int err = errno;
    close(fd);
    if (rc != 0 && !(dir && (err == EINVAL || err == EROFS)))
        return pt_error_set(PT_ERR_IO, "%s: fsync: %s", path, strerror(err));
    return PT_OK;
}

/* path := text and a newline, through pt_out (temporary, fsync, rename);
 * a failure names path. With `synced`, reached between the fsync and the
 * rename (a crash test's point). */
static pt_status write_line(const char *path, const char *text, int synced) {
    pt_out *o = NULL;
    PT_CHECK(pt_out_open(&o, path));
    pt_status st = pt_out_write(o, text, strlen(text));
    if (st == PT_OK) st = pt_out_write(o, "\n", 1);
    if (st == PT_OK) st = pt_out_sync(o);
    if (st != PT_OK) {
        pt_out_abort(o);
        return st;
    }
    if (synced >= 0) reached((pt_ckpt_point)synced);
    return pt_out_commit(o);
}

pt_status pt_mkdir_p(const char *dir) {
    char buf[PT_CONFIG_STR_MAX + 64];
    if (snprintf(buf, sizeof buf, "%s", dir) >= (int)sizeof buf)
        return pt_error_set(PT_ERR_INVALID, "%s: path too long", dir);
    for (char *p = buf + 1; *p; p++) {
        if (*p != '/') continue;
        *p = '\0';
        if (mkdir(buf, 0755) != 0 && errno != EEXIST)
            return pt_error_set(PT_ERR_IO, "%s: %s", buf, strerror(errno));
        *p = '/';
    }
    if (mkdir(buf, 0755) != 0 && errno != EEXIST)
        return pt_error_set(PT_ERR_IO, "%s: %s", buf, strerror(errno));
    struct stat sb;
    if (stat(buf, &sb) != 0 || !S_ISDIR(sb.st_mode))
        return pt_error_set(PT_ERR_IO, "%s: not a directory", buf);
    return PT_OK;
}

/* Remove a directory holding only plain files (ours), or a plain file;
 * `half` is reached after the first file is gone (a crash half-way). */
static void remove_entry(const char *path, int half) {
    struct stat sb;
    if (lstat(path, &sb) != 0) return;
    if (!S_ISDIR(sb.st_mode)) {
        unlink(path);
        return;
    }
    DIR *d = opendir(path);
    if (!d) return;
    struct dirent *e;
    char file[PATH_MAX_CK + 512];
    int removed = 0;
    while ((e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        snprintf(file, sizeof file, "%s/%s", path, e->d_name);
        if (unlink(file) == 0 && removed++ == 0 && half >= 0) reached((pt_ckpt_point)half);
    }
    closedir(d);
    rmdir(path);
}

static int is_dir(const char *path) {
    struct stat sb;
    return stat(path, &sb) == 0 && S_ISDIR(sb.st_mode);
}

/* "step_<digits>" (what this protocol names step directories): its step,
 * or -1. */
static long step_of(const char *name) {
    if (strncmp(name, "step_", 5) != 0 || !name[5]) return -1;
    long v = 0;
    for (const char *p = name + 5; *p; p++) {
        if (*p < '0' || *p > '9' || v > 100000000000L) return -1;
        v = v * 10 + (*p - '0');
    }
    return v;
}

/* ---- latest ---- */

/* The step directory name DIR/latest holds (*have 0: no latest file). A
 * latest that is a FIFO or a directory is refused, never waited on. */
static pt_status read_latest(const char *dir, char *name, size_t n, int *have) {
    char path[PATH_MAX_CK];
    *have = 0;
    name[0] = '\0';
    snprintf(path, sizeof path, "%s/latest", dir);
    struct stat sb;
    if (lstat(path, &sb) != 0 && errno == ENOENT) return PT_OK;
    FILE *f = NULL;
    PT_CHECK(pt_file_open_regular(path, &f, NULL));
    size_t len = fread(name, 1, n - 1, f);
    fclose(f);
    name[len] = '\0';
    while (len && (name[len - 1] == '\n' || name[len - 1] == ' ' || name[len - 1] == '\r'))
        name[--len] = '\0';
    if (!len || strchr(name, '/') || strchr(name, '\n') || !strcmp(name, ".") ||
        !strcmp(name, ".."))
        return pt_error_set(PT_ERR_FORMAT, "%s: corrupt (expected a step directory name)", path);
    *have = 1;
    return PT_OK;
}

/* DIR/.old-<name>-PID: the old copy of step directory `name` that a save
 * on the fallback path moved aside (the newest, when several). 1 if found. */
static int find_old_copy(const char *dir, const char *name, char *out, size_t n) {
    char prefix[300];
    snprintf(prefix, sizeof prefix, ".old-%s-", name);
    DIR *d = opendir(dir);
    if (!d) return 0;
    struct dirent *e;
    int found = 0;
    time_t best = 0;
    while ((e = readdir(d))) {
        if (strncmp(e->d_name, prefix, strlen(prefix)) != 0) continue;
        char path[PATH_MAX_CK + 300], model[PATH_MAX_CK + 320];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        snprintf(model, sizeof model, "%s/model.safetensors", path);
        struct stat sb;
        if (!is_dir(path) || stat(model, &sb) != 0) continue;
        if (found && sb.st_mtime < best) continue;
        if (snprintf(out, n, "%s", path) >= (int)n) continue;
        best = sb.st_mtime;
        found = 1;
    }
    closedir(d);
    return found;
}

/* The step directory with the highest step in dir, 1 if any. */
static int newest_step_dir(const char *dir, char *out, size_t n) {
    DIR *d = opendir(dir);
    if (!d) return 0;
    struct dirent *e;
    long best = -1;
    while ((e = readdir(d))) {
        long s = step_of(e->d_name);
        char path[PATH_MAX_CK + 300];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        if (s <= best || !is_dir(path)) continue;
        if (snprintf(out, n, "%s", path) >= (int)n) continue;
        best = s;
    }
    closedir(d);
    return best >= 0;
}

pt_status pt_checkpoint_resolve(const char *dir, char *out, size_t n) {
    char name[256];
    int have = 0;
    PT_CHECK(read_latest(dir, name, sizeof name, &have));
    if (have) {
        if (snprintf(out, n, "%s/%s", dir, name) >= (int)n)
            return pt_error_set(PT_ERR_INVALID, "%s: path too long", dir);
        if (is_dir(out)) return PT_OK;
        if (find_old_copy(dir, name, out, n)) {
            PT_INFO("%s/latest names %s, which a save that died moved aside: reading %s", dir, name,
                    out);
            return PT_OK;
        }
        return pt_error_set(PT_ERR_FORMAT, "%s/latest names %s, which is not a directory there",
                            dir, name);
    }
    char path[PATH_MAX_CK];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    if (access(path, F_OK) == 0) { /* a step directory itself */
        if (snprintf(out, n, "%s", dir) >= (int)n)
            return pt_error_set(PT_ERR_INVALID, "%s: path too long", dir);
        return PT_OK;
    }
    /* no latest yet: a first save that died after its rename */
    if (newest_step_dir(dir, out, n)) {
        PT_INFO("%s has no 'latest': reading the newest step directory, %s", dir, out);
        return PT_OK;
    }
    struct stat sb;
    if (stat(dir, &sb) != 0) return pt_error_set(PT_ERR_IO, "%s: %s", dir, strerror(errno));
    return pt_error_set(PT_ERR_FORMAT, "%s: not a checkpoint (no 'latest' or model.safetensors)",
                        dir);
}

/* ---- the lock, recovery and leftovers ---- */

/* Under the lock: put back the old copy a fallback save moved aside, then
 * remove what killed or failed saves left: .tmp-step_* (unfinished, or an
 * old copy swapped out), .old-step_* and .del-step_* (old copies half
 * removed), .latest.tmp*. Nothing else in dir is touched. */
static pt_status recover(const char *dir) {
    char name[256], path[PATH_MAX_CK + 300], old[PATH_MAX_CK + 300];
    int have = 0;
    if (read_latest(dir, name, sizeof name, &have) != PT_OK) {
        PT_WARN("%s", pt_error_message()); /* resume reports it, if it reads this directory */
        have = 0;
    }
    if (have) {
        snprintf(path, sizeof path, "%s/%s", dir, name);
        if (!is_dir(path) && find_old_copy(dir, name, old, sizeof old)) {
            if (rename(old, path) != 0)
                return pt_error_set(PT_ERR_IO, "%s: rename to %s: %s", old, path, strerror(errno));
            PT_CHECK(fsync_path(dir, 1));
            PT_WARN("%s: put back %s, which a save that died had moved aside", dir, name);
        }
    }
    DIR *d = opendir(dir);
    if (!d) return pt_error_set(PT_ERR_IO, "%s: %s", dir, strerror(errno));
    static const char *const leftovers[] = {".tmp-step_", ".old-step_", ".del-step_",
                                            ".latest.tmp"};
    struct dirent *e;
    int removed = 0;
    while ((e = readdir(d))) {
        int ours = 0;
        for (size_t i = 0; i < sizeof leftovers / sizeof leftovers[0]; i++)
            if (!strncmp(e->d_name, leftovers[i], strlen(leftovers[i]))) ours = 1;
        if (!ours || (have && !strcmp(e->d_name, name))) continue;
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        remove_entry(path, -1);
        if (access(path, F_OK) == 0)
            PT_WARN("%s: could not remove all of it (not only our files?)", path);
        else
            removed++;
    }
    closedir(d);
    if (removed)
        PT_INFO("%s: removed %d leftover%s of earlier saves", dir, removed,
                removed == 1 ? "" : "s");
    return PT_OK;
}

pt_status pt_ckpt_dir_open(const char *dir, int *lock_fd) {
    *lock_fd = -1;
    PT_CHECK(pt_mkdir_p(dir));
    if (access(dir, W_OK | X_OK) != 0)
        return pt_error_set(PT_ERR_IO, "%s: not writable: %s", dir, strerror(errno));
    char path[PATH_MAX_CK];
    snprintf(path, sizeof path, "%s/.lock", dir);
    /* O_NONBLOCK: a FIFO planted as .lock must not block the open */
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK, 0644);
    if (fd < 0) return pt_error_set(PT_ERR_IO, "%s: %s", path, strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        close(fd);
        return pt_error_set(PT_ERR_IO, "%s: not a regular file", path);
    }
    if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
        int err = errno;
        char pid[32] = {0};
        ssize_t got = pread(fd, pid, sizeof pid - 1, 0);
        close(fd);
        for (ssize_t i = 0; i < got; i++)
            if (pid[i] < '0' || pid[i] > '9') pid[i] = '\0';
        /* the pid the holder wrote; not alive here: another host's, or a
         * holder that is not partrain and wrote none */
        long holder = got > 0 ? strtol(pid, NULL, 10) : 0;
        if (holder <= 0 || (kill((pid_t)holder, 0) != 0 && errno == ESRCH))
            snprintf(pid, sizeof pid, "unknown");
        if (err == EWOULDBLOCK)
            return pt_error_set(PT_ERR_IO,
                                "%s: in use by another job (pid %s holds %s); give each job its "
                                "own checkpoint.dir",
                                dir, pid, path);
        return pt_error_set(PT_ERR_IO, "%s: lock: %s", path, strerror(err));
    }
    /* our pid, for the message of the job refused */
    char me[32];
    int len = snprintf(me, sizeof me, "%d\n", (int)getpid());
    if (ftruncate(fd, 0) != 0 || pwrite(fd, me, (size_t)len, 0) != len) {
        int err = errno;
        close(fd);
        return pt_error_set(PT_ERR_IO, "%s: write failed: %s", path, strerror(err));
    }
    pt_status st = recover(dir);
    if (st != PT_OK) {
        close(fd);
        return st;
    }
    *lock_fd = fd;
    return PT_OK;
}

void pt_ckpt_dir_close(int lock_fd) {
    if (lock_fd >= 0) close(lock_fd); /* releases the flock */
}

/* ---- a save ---- */

pt_status pt_ckpt_begin(const char *dir, int step, char *tmp, size_t n) {
    PT_CHECK(pt_mkdir_p(dir));
    if (snprintf(tmp, n, "%s/.tmp-step_%08d-%d", dir, step, (int)getpid()) >= (int)n)
        return pt_error_set(PT_ERR_INVALID, "%s: path too long", dir);
    remove_entry(tmp, -1);
    if (mkdir(tmp, 0755) != 0) return pt_error_set(PT_ERR_IO, "%s: %s", tmp, strerror(errno));
    reached(PT_CKPT_AT_BEGUN);
    return PT_OK;
}

void pt_ckpt_abort(const char *tmp) {
    remove_entry(tmp, -1);
}

pt_status pt_ckpt_write_state(const char *tmp, const char *state_json) {
    char path[PT_CONFIG_STR_MAX + 128];
    snprintf(path, sizeof path, "%s/state.json", tmp);
    return write_line(path, state_json, -1);
}

/* Whether renameat2's RENAME_EXCHANGE failed because this file system (or
 * kernel) cannot swap, rather than for a reason the fallback would hit too. */
static int cannot_swap(int err) {
    return err == EINVAL || err == ENOSYS || err == ENOTSUP || err == EOPNOTSUPP;
}

pt_status pt_ckpt_commit(const char *dir, int step, const char *tmp) {
    char name[32], final[PATH_MAX_CK], old[PATH_MAX_CK];
    snprintf(name, sizeof name, "step_%08d", step);
    snprintf(final, sizeof final, "%s/%s", dir, name);
    pt_status st = fsync_path(tmp, 1);
    if (st != PT_OK) goto fail;
    reached(PT_CKPT_AT_SYNCED);
    int had_old = 0;
    struct stat sb;
    if (lstat(final, &sb) == 0) {
        /* saved again (after a resume at this step): swap, so that step_N,
         * which latest may name, is complete at every instant */
        int err = EINVAL;
        if (!no_exchange) {
            err = 0;
            if (renameat2(AT_FDCWD, tmp, AT_FDCWD, final, RENAME_EXCHANGE) != 0) err = errno;
        }
        if (err == 0) {
            snprintf(old, sizeof old, "%s", tmp); /* the old copy has the temporary name */
        } else if (cannot_swap(err)) {
            snprintf(old, sizeof old, "%s/.old-%s-%d", dir, name, (int)getpid());
            remove_entry(old, -1);
            if (rename(final, old) != 0) {
                st = pt_error_set(PT_ERR_IO, "%s: rename: %s", final, strerror(errno));
                goto fail;
            }
            reached(PT_CKPT_AT_MOVED_ASIDE);
            if (rename(tmp, final) != 0) {
                st = pt_error_set(PT_ERR_IO, "%s: rename: %s", final, strerror(errno));
                rename(old, final);
                goto fail;
            }
        } else {
            st = pt_error_set(PT_ERR_IO, "%s: rename: %s", final, strerror(err));
            goto fail;
        }
        had_old = 1;
    } else if (rename(tmp, final) != 0) {
        st = pt_error_set(PT_ERR_IO, "%s: rename: %s", final, strerror(errno));
        goto fail;
    }
    reached(PT_CKPT_AT_IN_PLACE);
    st = fsync_path(dir, 1);
    if (st == PT_OK) reached(PT_CKPT_AT_DIR_SYNCED);
    /* the old copy goes whether or not the fsync worked: nothing of it is
     * needed once the new one has the name, and none is left behind */
    if (had_old) remove_entry(old, PT_CKPT_AT_OLD_HALF_REMOVED);
    PT_CHECK(st);
    /* then `latest`: written beside it (DIR/.latest.tmp<pid>.<n>), renamed
     * over it */
    char latest[PATH_MAX_CK];
    snprintf(latest, sizeof latest, "%s/latest", dir);
    PT_CHECK(write_line(latest, name, PT_CKPT_AT_LATEST_WRITTEN));
    reached(PT_CKPT_AT_LATEST);
    return fsync_path(dir, 1);
fail:
    remove_entry(tmp, -1);
    return st;
}

typedef struct {
    long step;
    char name[64];
} step_entry;

/* The step directories in dir, newest (highest step) first (malloc'd, *n). */
static step_entry *list_steps(const char *dir, size_t *n) {
    *n = 0;
    DIR *d = opendir(dir);
    if (!d) return NULL;
    size_t cap = 0;
    step_entry *v = NULL;
    struct dirent *e;
    while ((e = readdir(d))) {
        long s = step_of(e->d_name);
        char path[PATH_MAX_CK + 300];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        size_t len = strlen(e->d_name);
        if (s < 0 || len >= sizeof v->name || !is_dir(path)) continue;
        if (*n == cap) {
            cap = cap ? cap * 2 : 64;
            step_entry *nv = realloc(v, cap * sizeof *v);
            if (!nv) break;
            v = nv;
        }
        v[*n].step = s;
        memcpy(v[*n].name, e->d_name, len + 1);
        (*n)++;
    }
    closedir(d);
    for (size_t i = 1; i < *n; i++) /* insertion sort: a handful of entries */
        for (size_t j = i; j > 0 && v[j - 1].step < v[j].step; j--) {
            step_entry x = v[j];
            v[j] = v[j - 1];
            v[j - 1] = x;
        }
    return v;
}

void pt_ckpt_prune(const char *dir, int keep) {
    if (keep <= 0) return;
    char latest[256];
    int have = 0;
    if (read_latest(dir, latest, sizeof latest, &have) != PT_OK) return; /* unsure: keep all */
    size_t n = 0;
    step_entry *steps = list_steps(dir, &n);
    for (size_t i = (size_t)keep; i < n; i++) {
        const char *name = steps[i].name;
        char path[PATH_MAX_CK + 64], del[PATH_MAX_CK + 96];
        if (have && !strcmp(name, latest)) continue; /* what latest names stays */
        snprintf(path, sizeof path, "%s/%s", dir, name);
        snprintf(del, sizeof del, "%s/.del-%s-%d", dir, name, (int)getpid());
        remove_entry(del, -1);
        if (rename(path, del) != 0) {
            PT_WARN("checkpoint.keep: %s: rename: %s (left in place)", path, strerror(errno));
            continue;
        }
        remove_entry(del, PT_CKPT_AT_PRUNE_HALF_REMOVED);
        if (access(del, F_OK) == 0)
            PT_WARN("checkpoint.keep: could not remove all of %s (the next run retries)", del);
    }
    free(steps);
}
