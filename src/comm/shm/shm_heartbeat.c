/* The heartbeat: one thread per rank process with a world of several.
 * Stores pt_time_ns() into the rank's beat every period (live_s / 20, from
 * 5 to 200 ms), independently of the main and progress threads, on the comm
 * layer's ticker (ticker.h). Waiters compare it with their clock (one
 * host: one monotonic clock).
 *
 * Not here: who checks the beats and what a stale one means (shm_wait.c). */
#include "shm_impl.h"
#include "ticker.h"

#include <pthread.h>

static struct {
    pt_ticker tick;
    shm_rank_info *ri;
} hb;

static void hb_beat(void *arg) {
    (void)arg;
    atomic_store_explicit(&hb.ri->beat, pt_time_ns(), memory_order_release);
}

/* A child forked while a heartbeat ran has no such thread. */
static void hb_after_fork(void) {
    pt_ticker_forget(&hb.tick);
}

pt_status shm_hb_start(pt_shm_job *job, int wrank, double live_s) {
    if (job->nranks < 2 || hb.tick.running) return PT_OK;
    static int atfork_set;
    if (!atfork_set) atfork_set = pthread_atfork(NULL, NULL, hb_after_fork) == 0;
    double p = live_s / 20;
    p = p < 0.005 ? 0.005 : p > 0.2 ? 0.2 : p;
    hb.ri = &job->ranks[wrank];
    atomic_store(&hb.ri->beat, pt_time_ns());
    return pt_ticker_start(&hb.tick, (uint64_t)(p * 1e9), hb_beat, NULL, "shm heartbeat");
}

/* The world is freed: no heartbeat from here on, and none is expected. */
void shm_hb_stop(const shm_rank_info *ri) {
    if (!hb.tick.running || hb.ri != ri) return;
    pt_ticker_stop(&hb.tick);
    atomic_store(&hb.ri->beat, BEAT_OFF);
}
