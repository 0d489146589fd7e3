/* The collective save of a sliced checkpoint (ckpt_impl.h), in five moves
 * over the writers' communicator:
 *   1. every rank tells rank 0 its slots and how many bytes of each it
 *      writes (the only thing that travels: no tensor data);
 *   2. rank 0 checks that the bytes tile every group exactly (a group is
 *      the whole model's tensors), decides the files, makes the protocol's
 *      temporary directory (pt_ckpt_begin) and creates each file: its
 *      header (GPT-2's names and full shapes) and its full size;
 *   3. rank 0 sends every rank the temporary directory and where each
 *      group lies;
 *   4. every rank pwrites its pieces at their offsets and fsyncs each file
 *      it wrote; all agree;
 *   5. rank 0 writes state.json and commits (the caller's commit
 *      function: ckpt_dir.c's rename, latest, keep); all agree again.
 * A failure anywhere makes every rank return the first failing rank's
 * line, rank 0 removes the temporary directory, and `latest` still names
 * the checkpoint before: the directory protocol is unchanged, and a crash
 * at any moment leaves only a hidden directory the next run removes.
 *
 * Every write is checked and names its file ("DIR/.tmp-step_N-PID/
 * model.safetensors: write failed: File too large"); the files are written
 * in place inside the temporary directory, which is what makes them
 * atomic (not pt_out: several ranks write one file).
 *
 * Not here: what the pieces are (ckpt_plan.c), state.json (trainer). */
#include "ckpt_impl.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

enum { TAG_SLOTS = 51 };

typedef struct {
    char file[PT_CKPT_FILE_MAX];
    char group[PT_CKPT_PREFIX_MAX];
    uint64_t bytes;
} wire_slot;

static pt_status pwrite_all(int fd, const char *path, const char *buf, uint64_t len, uint64_t off) {
    while (len) {
        size_t chunk = len > ((uint64_t)1 << 30) ? (size_t)1 << 30 : (size_t)len;
        ssize_t w = pwrite(fd, buf, chunk, (off_t)off);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0)
            return pt_error_set(PT_ERR_IO, "%s: write failed: %s", path,
                                w < 0 ? strerror(errno) : "no progress");
        buf += w;
        off += (uint64_t)w;
        len -= (uint64_t)w;
    }
    return PT_OK;
}

/* ---- rank 0: the files ---- */

/* Files in their order: model, optim_m, optim_v, sync, replica<d> by d. */
static long file_rank(const char *name) {
    if (!strcmp(name, "model")) return 0;
    if (!strcmp(name, "optim_m")) return 1;
    if (!strcmp(name, "optim_v")) return 2;
    if (!strcmp(name, "sync")) return 3;
    return 4 + (strncmp(name, "replica", 7) ? 0 : strtol(name + 7, NULL, 10));
}

static int cmp_slot(const void *a, const void *b) {
    const wire_slot *x = a, *y = b;
    long fx = file_rank(x->file), fy = file_rank(y->file);
    if (fx != fy) return fx < fy ? -1 : 1;
    int c = strcmp(x->file, y->file);
    return c ? c : strcmp(x->group, y->group);
}

/* Every rank's slots merged into w (n entries: distinct, sorted, bytes
 * summed): the files and their groups. */
static pt_status merge_slots(wire_slot *w, size_t *n) {
    qsort(w, *n, sizeof *w, cmp_slot);
    size_t k = 0;
    for (size_t i = 0; i < *n; i++) {
        if (k && !cmp_slot(&w[k - 1], &w[i]))
            w[k - 1].bytes += w[i].bytes;
        else
            w[k++] = w[i];
    }
    *n = k;
    return PT_OK;
}

static pt_status files_from(const wire_slot *w, size_t n, pt_ckpt_files *fs) {
    memset(fs, 0, sizeof *fs);
    fs->f = calloc(n ? n : 1, sizeof *fs->f);
    if (!fs->f) return pt_error_set(PT_ERR_NOMEM, "checkpoint: file table");
    for (size_t i = 0; i < n; i++) {
        if (!fs->nf || strcmp(fs->f[fs->nf - 1].name, w[i].file) != 0) {
            pt_ckpt_file *f = &fs->f[fs->nf++];
            snprintf(f->name, sizeof f->name, "%s", w[i].file);
            f->group = calloc(n, sizeof *f->group);
            if (!f->group) return pt_error_set(PT_ERR_NOMEM, "checkpoint: file table");
        }
        pt_ckpt_file *f = &fs->f[fs->nf - 1];
        snprintf(f->group[f->ng++], PT_CKPT_PREFIX_MAX, "%s", w[i].group);
    }
    return PT_OK;
}

/* Create tmp/<name>.safetensors: header, then the full size (the data
 * section a hole the ranks fill), synced: a file rank 0 writes nothing
 * else of has its header on disk too. */
static pt_status create_file(const char *tmp, pt_ckpt_file *f, const pt_model *full, int step) {
    char path[PT_CONFIG_STR_MAX + 128], s[16];
    snprintf(path, sizeof path, "%s/%s.safetensors", tmp, f->name);
    snprintf(s, sizeof s, "%d", step);
    const char *meta[] = {"partrain", "rank_state", "file", f->name, "step", s, NULL};
    pt_ckpt_group *g = calloc((size_t)f->ng, sizeof *g);
    if (!g) return pt_error_set(PT_ERR_NOMEM, "%s: out of memory", path);
    for (int i = 0; i < f->ng; i++) snprintf(g[i].prefix, sizeof g[i].prefix, "%s", f->group[i]);
    size_t hlen = 0;
    unsigned char *head =
        pt_st_header_bytes(full, pt_ckpt_is_main(f->name) ? NULL : meta, g, f->ng, &hlen);
    free(g);
    if (!head) return pt_error_set(PT_ERR_NOMEM, "%s: out of memory", path);
    f->data_start = hlen;
    uint64_t size = hlen + (uint64_t)f->ng * pt_model_num_params(full) * sizeof(float);
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    pt_status st = fd >= 0 ? pwrite_all(fd, path, (const char *)head, hlen, 0)
                           : pt_error_set(PT_ERR_IO, "%s: %s", path, strerror(errno));
    free(head);
    if (st == PT_OK && ftruncate(fd, (off_t)size) != 0)
        st = pt_error_set(PT_ERR_IO, "%s: write failed: %s", path, strerror(errno));
    if (st == PT_OK && fsync(fd) != 0)
        st = pt_error_set(PT_ERR_IO, "%s: fsync: %s", path, strerror(errno));
    if (fd >= 0 && close(fd) != 0 && st == PT_OK)
        st = pt_error_set(PT_ERR_IO, "%s: write failed: %s", path, strerror(errno));
    return st;
}

/* Rank 0's step 2: check the totals, then the directory and the files. */
static pt_status make_files(const pt_ckpt_write_job *j, wire_slot *w, size_t n, char *tmp,
                            size_t tmpn, pt_ckpt_files *fs) {
    PT_CHECK(merge_slots(w, &n));
    uint64_t group_bytes = (uint64_t)pt_model_num_params(j->full) * sizeof(float);
    for (size_t i = 0; i < n; i++)
        if (w[i].bytes != group_bytes)
            return pt_error_set(PT_ERR_INTERNAL,
                                "checkpoint: the ranks would write %" PRIu64 " bytes of "
                                "%s.safetensors's group '%s', which holds %" PRIu64
                                " (the write plan's bug)",
                                w[i].bytes, w[i].file, w[i].group, group_bytes);
    PT_CHECK(files_from(w, n, fs));
    PT_CHECK(pt_ckpt_begin(j->dir, j->step, tmp, tmpn));
    for (int i = 0; i < fs->nf; i++) PT_CHECK(create_file(tmp, &fs->f[i], j->full, j->step));
    return PT_OK;
}

/* ---- the layout, as text from rank 0 ---- */

static char *layout_text(const char *tmp, const pt_ckpt_files *fs, uint64_t *len) {
    size_t cap = strlen(tmp) + 64, at = 0;
    for (int i = 0; i < fs->nf; i++) cap += 96 + (size_t)fs->f[i].ng * (PT_CKPT_PREFIX_MAX + 8);
    char *s = malloc(cap);
    if (!s) return NULL;
    at += (size_t)snprintf(s + at, cap - at, "%s\n", tmp);
    for (int i = 0; i < fs->nf; i++) {
        const pt_ckpt_file *f = &fs->f[i];
        at += (size_t)snprintf(s + at, cap - at, "%s %" PRIu64 " %d\n", f->name, f->data_start,
                               f->ng);
        for (int g = 0; g < f->ng; g++)
            at += (size_t)snprintf(s + at, cap - at, "=%s\n", f->group[g]);
    }
    *len = at + 1;
    return s;
}

/* Our own text (rank 0's layout_text): a malformed line is our bug. */
static void layout_parse(char *s, char *tmp, size_t tmpn, pt_ckpt_files *fs) {
    char *save = NULL, *line = strtok_r(s, "\n", &save);
    PT_ASSERT(line);
    snprintf(tmp, tmpn, "%s", line);
    size_t lines = 0;
    for (char *p = save; p && *p; p++) lines += *p == '\n';
    memset(fs, 0, sizeof *fs);
    fs->f = calloc(lines + 1, sizeof *fs->f);
    PT_ASSERT(fs->f);
    while ((line = strtok_r(NULL, "\n", &save))) {
        if (line[0] == '=') {
            pt_ckpt_file *f = &fs->f[fs->nf - 1];
            snprintf(f->group[f->ng++], PT_CKPT_PREFIX_MAX, "%s", line + 1);
            continue;
        }
        pt_ckpt_file *f = &fs->f[fs->nf++];
        int ng = 0;
        PT_ASSERT(sscanf(line, "%31s %" SCNu64 " %d", f->name, &f->data_start, &ng) == 3);
        f->group = calloc((size_t)ng + 1, sizeof *f->group);
        PT_ASSERT(f->group);
    }
}

/* Steps 1 to 3 on every rank: on success, fs and tmp hold the layout
 * (tmp set on rank 0 as soon as it made the directory). */
static pt_status agree_layout(const pt_ckpt_write_job *j, char *tmp, size_t tmpn,
                              pt_ckpt_files *fs) {
    pt_comm *c = j->comm;
    int rank = c ? pt_comm_rank(c) : 0, size = c ? pt_comm_size(c) : 1;
    wire_slot *mine = NULL;
    uint64_t *bytes = NULL;
    pt_status st = j->entry;
    int ns = st == PT_OK ? j->set->ns : 0;
    if (st == PT_OK && (!(mine = calloc((size_t)(ns ? ns : 1), sizeof *mine)) ||
                        !(bytes = calloc((size_t)(ns ? ns : 1), sizeof *bytes))))
        st = pt_error_set(PT_ERR_NOMEM, "checkpoint: slots");
    if (st == PT_OK) pt_ckpt_share_bytes(j->set, bytes);
    for (int i = 0; st == PT_OK && i < ns; i++) {
        snprintf(mine[i].file, sizeof mine[i].file, "%s", j->set->s[i].file);
        snprintf(mine[i].group, sizeof mine[i].group, "%s", j->set->s[i].group);
        mine[i].bytes = bytes[i];
    }
    free(bytes);
    if (c) st = pt_comm_agree(c, st);
    if (st != PT_OK) {
        free(mine);
        return st;
    }
    int32_t count = ns;
    wire_slot *all = NULL;
    if (rank != 0) {
        st = pt_comm_send(c, &count, sizeof count, 0, TAG_SLOTS);
        for (int i = 0; st == PT_OK && i < ns; i++)
            st = pt_comm_send(c, &mine[i], sizeof mine[i], 0, TAG_SLOTS);
    } else {
        size_t n = (size_t)ns, cap = (size_t)ns + 16;
        all = malloc(cap * sizeof *all);
        if (all) memcpy(all, mine, (size_t)ns * sizeof *mine);
        pt_status e = all ? PT_OK : pt_error_set(PT_ERR_NOMEM, "checkpoint: slots");
        for (int r = 1; r < size && st == PT_OK; r++) {
            st = pt_comm_recv(c, &count, sizeof count, r, TAG_SLOTS);
            if (st == PT_OK && (count < 0 || count > 100000))
                st = pt_error_set(PT_ERR_INTERNAL, "checkpoint: rank %d sent %d slots", r, count);
            wire_slot *buf = NULL;
            if (st == PT_OK && e == PT_OK && n + (size_t)count > cap) {
                cap = 2 * (n + (size_t)count);
                buf = realloc(all, cap * sizeof *all);
                if (buf)
                    all = buf;
                else
                    e = pt_error_set(PT_ERR_NOMEM, "checkpoint: slots");
            }
            /* received even when out of memory, so that no rank is left in its send */
            wire_slot sink;
            for (int32_t k = 0; st == PT_OK && k < count; k++)
                st = pt_comm_recv(c, e == PT_OK ? &all[n + (size_t)k] : &sink, sizeof sink, r,
                                  TAG_SLOTS);
            if (e == PT_OK) n += (size_t)count;
        }
        if (st == PT_OK) st = e;
        if (st == PT_OK) st = make_files(j, all, n, tmp, tmpn, fs);
    }
    free(mine);
    free(all);
    if (c) st = pt_comm_agree(c, st);
    if (st != PT_OK || !c) return st;
    /* step 3: the layout to every rank */
    uint64_t len = 0;
    char *text = rank == 0 ? layout_text(tmp, fs, &len) : NULL;
    st = rank != 0 || text ? PT_OK : pt_error_set(PT_ERR_NOMEM, "checkpoint: layout");
    st = pt_comm_agree(c, st);
    if (st == PT_OK) st = pt_comm_broadcast(c, &len, sizeof len, 0);
    if (st == PT_OK && rank != 0 && !(text = malloc(len)))
        st = pt_error_set(PT_ERR_NOMEM, "checkpoint: layout");
    st = pt_comm_agree(c, st);
    if (st == PT_OK) st = pt_comm_broadcast(c, text, len, 0);
    if (st == PT_OK && rank != 0) layout_parse(text, tmp, tmpn, fs);
    free(text);
    return st;
}

/* ---- step 4: the pieces ---- */

typedef struct {
    int file;      /* into the layout */
    uint64_t base; /* the group's first byte in the file */
} placed;

/* Where this rank's slots lie in the agreed layout. */
static void place_slots(const pt_ckpt_set *set, const pt_ckpt_files *fs, uint64_t group_bytes,
                        placed *pl) {
    for (int i = 0; i < set->ns; i++) {
        pl[i].file = -1;
        for (int f = 0; f < fs->nf && pl[i].file < 0; f++) {
            if (strcmp(fs->f[f].name, set->s[i].file) != 0) continue;
            for (int g = 0; g < fs->f[f].ng; g++)
                if (!strcmp(fs->f[f].group[g], set->s[i].group)) {
                    pl[i] = (placed){f, fs->f[f].data_start + (uint64_t)g * group_bytes};
                    break;
                }
        }
        PT_ASSERT(pl[i].file >= 0); /* rank 0 made a file of every rank's slots */
    }
}

static void file_path(char *out, size_t n, const char *tmp, const char *name) {
    snprintf(out, n, "%s/%s.safetensors", tmp, name);
}

/* The emitter's sink: each piece at its offset, its file opened at its
 * first piece (fds: one per file of the layout, -1 until then). */
typedef struct {
    const char *tmp;
    const pt_ckpt_files *fs;
    const placed *pl;
    int *fds, rank0, partial;
    uint64_t written;
} sink;

static pt_status write_piece(void *arg, const pt_ckpt_piece *p) {
    sink *k = arg;
    int f = k->pl[p->slot].file;
    char path[PT_CONFIG_STR_MAX + 128];
    file_path(path, sizeof path, k->tmp, k->fs->f[f].name);
    if (k->rank0 && !k->partial && f > 0) { /* a test's crash point: model.safetensors done */
        pt_ckpt_reached(PT_CKPT_AT_PARTIAL);
        k->partial = 1;
    }
    if (k->fds[f] < 0 && (k->fds[f] = open(path, O_WRONLY | O_CLOEXEC)) < 0)
        return pt_error_set(PT_ERR_IO, "%s: %s", path, strerror(errno));
    PT_CHECK(pwrite_all(k->fds[f], path, p->src, p->len, k->pl[p->slot].base + p->off));
    k->written += p->len;
    return PT_OK;
}

/* Every piece at its offset, then an fsync of each file written. */
static pt_status write_pieces(const pt_ckpt_write_job *j, const char *tmp, const pt_ckpt_files *fs,
                              uint64_t *written) {
    const pt_ckpt_set *set = j->set;
    placed *pl = calloc((size_t)(set->ns ? set->ns : 1), sizeof *pl);
    int *fds = malloc((size_t)(fs->nf ? fs->nf : 1) * sizeof *fds);
    if (!pl || !fds) {
        free(pl);
        free(fds);
        return pt_error_set(PT_ERR_NOMEM, "checkpoint: slots");
    }
    for (int f = 0; f < fs->nf; f++) fds[f] = -1;
    place_slots(set, fs, (uint64_t)pt_model_num_params(j->full) * sizeof(float), pl);
    sink k = {tmp, fs, pl, fds, !j->comm || pt_comm_rank(j->comm) == 0, 0, 0};
    pt_status st = pt_ckpt_emit(set, j->staging, write_piece, &k);
    char path[PT_CONFIG_STR_MAX + 128];
    for (int f = 0; f < fs->nf; f++) {
        if (fds[f] < 0) continue;
        file_path(path, sizeof path, tmp, fs->f[f].name);
        if (st == PT_OK && fsync(fds[f]) != 0)
            st = pt_error_set(PT_ERR_IO, "%s: fsync: %s", path, strerror(errno));
        if (close(fds[f]) != 0 && st == PT_OK)
            st = pt_error_set(PT_ERR_IO, "%s: write failed: %s", path, strerror(errno));
    }
    *written = k.written;
    free(pl);
    free(fds);
    return st;
}

pt_status pt_ckpt_write(const pt_ckpt_write_job *j) {
    pt_comm *c = j->comm;
    int rank0 = !c || pt_comm_rank(c) == 0;
    char tmp[PT_CONFIG_STR_MAX + 64] = "";
    pt_ckpt_files fs = {0};
    uint64_t written = 0;
    pt_status st = agree_layout(j, tmp, sizeof tmp, &fs);
    if (st == PT_OK) st = write_pieces(j, tmp, &fs, &written);
    if (c) st = pt_comm_agree(c, st); /* every rank's pieces written and synced */
    if (rank0 && st == PT_OK)
        st = j->commit(j->commit_arg, tmp, &fs); /* removes tmp on failure */
    else if (rank0 && tmp[0])
        pt_ckpt_abort(tmp);
    if (c) st = pt_comm_agree(c, st);
    if (j->written) *j->written = written;
    pt_ckpt_files_deinit(&fs);
    return st;
}

pt_status pt_ckpt_agree(pt_comm *aux, pt_status st) {
    if (!aux) return st;
    return pt_comm_agree(aux, st);
}
