/* The comm layer's periodic thread (ticker.h): the shm and mpi heartbeats
 * run on it. Holds the thread, its monotonic condition variable and the
 * blocked signals; not the heartbeats themselves (shm/shm_heartbeat.c,
 * mpi/mpi_backend.c). */
#include "ticker.h"

#include <signal.h>
#include <time.h>

static void *ticker_main(void *p) {
    pt_ticker *t = p;
    pthread_mutex_lock(&t->mu);
    while (!t->stop) {
        t->kicked = 0;
        pthread_mutex_unlock(&t->mu);
        t->fn(t->arg);
        pthread_mutex_lock(&t->mu);
        if (t->stop || t->kicked) continue;
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        uint64_t ns = (uint64_t)ts.tv_nsec + t->period_ns;
        ts.tv_sec += (time_t)(ns / 1000000000ull);
        ts.tv_nsec = (long)(ns % 1000000000ull);
        pthread_cond_timedwait(&t->cv, &t->mu, &ts);
    }
    pthread_mutex_unlock(&t->mu);
    return NULL;
}

pt_status pt_ticker_start(pt_ticker *t, uint64_t period_ns, pt_ticker_fn fn, void *arg,
                          const char *what) {
    PT_ASSERT(t && fn && !t->running);
    pthread_mutex_init(&t->mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&t->cv, &ca);
    pthread_condattr_destroy(&ca);
    t->period_ns = period_ns;
    t->fn = fn;
    t->arg = arg;
    t->stop = t->kicked = 0;
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    int e = pthread_create(&t->thread, NULL, ticker_main, t);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (e != 0) {
        pthread_cond_destroy(&t->cv);
        pthread_mutex_destroy(&t->mu);
        return pt_error_set(PT_ERR_INTERNAL, "cannot start the %s thread (%d)", what, e);
    }
    t->running = 1;
    return PT_OK;
}

void pt_ticker_kick(pt_ticker *t) {
    if (!t->running) return;
    pthread_mutex_lock(&t->mu);
    t->kicked = 1;
    pthread_cond_signal(&t->cv);
    pthread_mutex_unlock(&t->mu);
}

void pt_ticker_stop(pt_ticker *t) {
    if (!t->running) return;
    pthread_mutex_lock(&t->mu);
    t->stop = 1;
    pthread_cond_signal(&t->cv);
    pthread_mutex_unlock(&t->mu);
    pthread_join(t->thread, NULL);
    pthread_cond_destroy(&t->cv);
    pthread_mutex_destroy(&t->mu);
    t->running = 0;
}

void pt_ticker_forget(pt_ticker *t) {
    t->running = 0;
}
