/* The device mesh (parallel.h, pt_mesh): this rank's coordinates in the
 * dp x tp x pp grid of the world, in Megatron's order (tp fastest, then dp,
 * then pp), and the communicators of the four groups it belongs to, each
 * made once by pt_comm_split over the world.
 *
 * Not here: what runs on the groups (ddp.c, zero.c, later tensor-parallel
 * linears and pipeline schedules), choosing a layout (the planner), and
 * checking a config against the world (the trainer names the config keys). */
#include <stdlib.h>

#include "partrain/parallel.h"

struct pt_mesh {
    pt_comm *world; /* lent; NULL: a world of one */
    int world_rank, world_size;
    int dp, tp, pp;
    int size[PT_MESH_NGROUPS];      /* ranks in each group */
    int index[PT_MESH_NGROUPS];     /* this rank's index in each group */
    pt_comm *comm[PT_MESH_NGROUPS]; /* owned; NULL for a group of one */
};

int pt_mesh_rank_at(int dp, int tp, int pp, int pp_i, int dp_i, int tp_i) {
    (void)pp;
    return (pp_i * dp + dp_i) * tp + tp_i;
}

void pt_mesh_coords_of(int rank, int dp, int tp, int pp, int *pp_i, int *dp_i, int *tp_i) {
    (void)pp;
    *tp_i = rank % tp;
    *dp_i = rank / tp % dp;
    *pp_i = rank / (tp * dp);
}

void pt_mesh_free(pt_mesh *m) {
    if (!m) return;
    for (int g = PT_MESH_NGROUPS - 1; g >= 0; g--) pt_comm_free(m->comm[g]);
    free(m);
}

pt_status pt_mesh_new(pt_mesh **out, pt_comm *world, int dp, int tp, int pp) {
    *out = NULL;
    int n = world ? pt_comm_size(world) : 1;
    if (dp < 1 || tp < 1 || pp < 1 || (long long)dp * tp * pp != n)
        return pt_error_set(PT_ERR_INVALID,
                            "mesh: dp x tp x pp = %d x %d x %d = %lld must equal the world size, "
                            "but there %s %d rank%s",
                            dp, tp, pp, (long long)dp * tp * pp, n == 1 ? "is" : "are", n,
                            n == 1 ? "" : "s");
    pt_mesh *m = calloc(1, sizeof *m);
    if (!m) return pt_error_set(PT_ERR_NOMEM, "mesh");
    m->world = world;
    m->world_rank = world ? pt_comm_rank(world) : 0;
    m->world_size = n;
    m->dp = dp;
    m->tp = tp;
    m->pp = pp;
    int pp_i, dp_i, tp_i;
    pt_mesh_coords_of(m->world_rank, dp, tp, pp, &pp_i, &dp_i, &tp_i);
    /* per group: its size, this rank's index (the split key, so that the
     * order inside the group is the coordinate's, not an accident of world
     * ranks) and the color shared by exactly its members */
    const struct {
        int size, index, color;
        const char *role; /* the flight recorder's name: "dp group <color>" */
    } def[PT_MESH_NGROUPS] = {
        [PT_MESH_TP] = {tp, tp_i, pp_i * dp + dp_i, "tp"},
        [PT_MESH_DP] = {dp, dp_i, pp_i * tp + tp_i, "dp"},
        [PT_MESH_PP] = {pp, pp_i, dp_i * tp + tp_i, "pp"},
        [PT_MESH_MP] = {tp * pp, pp_i * tp + tp_i, dp_i, "mp"},
    };
    pt_status st = PT_OK;
    for (int g = 0; g < PT_MESH_NGROUPS; g++) {
        m->size[g] = def[g].size;
        m->index[g] = def[g].index;
        /* the sizes are the same on every rank: all ranks skip a size-1
         * kind of group alike, and split the others in the same order */
        if (def[g].size == 1) continue;
        PT_CHECK_GOTO(st, pt_comm_split(world, def[g].color, def[g].index, &m->comm[g]), fail);
        pt_comm_set_name(m->comm[g], def[g].role, def[g].color);
        PT_ASSERT_EQ(pt_comm_size(m->comm[g]), def[g].size);
        PT_ASSERT_EQ(pt_comm_rank(m->comm[g]), def[g].index);
    }
    *out = m;
    return PT_OK;
fail:
    pt_mesh_free(m);
    return st;
}

pt_comm *pt_mesh_comm(const pt_mesh *m, pt_mesh_group g) {
    return m->comm[g];
}
int pt_mesh_size(const pt_mesh *m, pt_mesh_group g) {
    return m->size[g];
}
int pt_mesh_index(const pt_mesh *m, pt_mesh_group g) {
    return m->index[g];
}
int pt_mesh_world_rank(const pt_mesh *m) {
    return m->world_rank;
}
int pt_mesh_world_size(const pt_mesh *m) {
    return m->world_size;
}
