/* Whether a layout's memory fits: what one rank may hold on a cluster
 * (its device's memory, or its share of one or of a node's RAM), what a
 * rank needs of it, and the one line that says why it does not fit.
 *
 * Not here: the memory itself (memory.c). */
#include "partrain/plan.h"

#include <stdio.h>

/* "93.1 GB" (decimal units, as device datasheets give memory). */
static void human(double b, char *buf, size_t n) {
    if (b >= 1e9)
        snprintf(buf, n, "%.1f GB", b / 1e9);
    else if (b >= 1e6)
        snprintf(buf, n, "%.1f MB", b / 1e6);
    else
        snprintf(buf, n, "%.1f kB", b / 1e3);
}

void pt_plan_rank_capacity(const pt_cluster *cl, int world, pt_plan_capacity *out) {
    long devices = (long)cl->nodes * cl->devices_per_node;
    double pool = cl->device.memory_bytes;
    int k = devices > 0 && world > devices ? (int)((world + devices - 1) / devices) : 1;
    const char *whose = "device";
    if (cl->profile && cl->nodes > 0) { /* RAM, shared by the node's ranks */
        k = (world + cl->nodes - 1) / cl->nodes;
        if (k < 1) k = 1;
        pool *= cl->devices_per_node, whose = "node";
    }
    out->bytes = pool / k, out->share = k;
    char a[32], b[32];
    human(out->bytes, a, sizeof a);
    human(pool, b, sizeof b);
    if (k == 1 && !cl->profile)
        snprintf(out->what, sizeof out->what, "the device has %s", a);
    else
        snprintf(out->what, sizeof out->what, "a rank has %s (the %s's %s over %d rank%s)", a,
                 whose, b, k, k == 1 ? "" : "s");
}

double pt_plan_mem_need(const pt_plan_mem_rank *m, const pt_plan_capacity *cap) {
    return m->total + m->save / cap->share;
}

int pt_plan_mem_overflow(const pt_plan_mem_rank *m, const pt_plan_capacity *cap, char *reason,
                         size_t n) {
    if (pt_plan_mem_need(m, cap) <= cap->bytes) {
        if (n) reason[0] = '\0';
        return 0;
    }
    /* the categories, largest first */
    int order[PT_MEM_NCAT];
    for (int k = 0; k < PT_MEM_NCAT; k++) order[k] = k;
    for (int i = 1; i < PT_MEM_NCAT; i++)
        for (int j = i; j > 0 && m->cat[order[j]] > m->cat[order[j - 1]]; j--) {
            int x = order[j];
            order[j] = order[j - 1];
            order[j - 1] = x;
        }
    char tot[32], part[64];
    human(m->total, tot, sizeof tot);
    size_t k = (size_t)snprintf(reason, n, "needs %s a rank (", tot);
    int first = 1;
    for (int i = 0; i < PT_MEM_NCAT; i++) {
        double b = m->cat[order[i]];
        if (b <= 0) continue;
        human(b, part, sizeof part);
        if (k < n)
            k += (size_t)snprintf(reason + k, n - k, "%s%s %s", first ? "" : ", ",
                                  pt_mem_cat_name((pt_mem_cat)order[i]), part);
        first = 0;
    }
    if (m->slack > 0 && k < n) {
        human(m->slack, part, sizeof part);
        k += (size_t)snprintf(reason + k, n - k, "%sslack %s", first ? "" : ", ", part);
    }
    if (m->save > 0 && k < n) {
        human(m->save, part, sizeof part);
        k += (size_t)snprintf(reason + k, n - k, "; a checkpoint save %s more%s", part,
                              cap->share > 1 ? ", on one of the ranks sharing it" : "");
    }
    if (k < n) snprintf(reason + k, n - k, "), %s", cap->what);
    return 1;
}
