/* Private to the comm layer: a periodic thread (the backends' heartbeats
 * and watchdogs). fn(arg) runs at once and then every period on
 * CLOCK_MONOTONIC (a wall-clock step must neither stall nor hurry it), on a
 * thread that starts with every signal blocked, so that signals meant for
 * the process (SIGINT, SIGCHLD for pt_launch) reach the threads that wait
 * for them. The ticker is caller-owned (a static or a struct field).
 *
 * Lifecycle: pt_ticker_start -> (pt_ticker_kick)* -> pt_ticker_stop. In a
 * child forked while a ticker ran there is no such thread: its atfork
 * handler calls pt_ticker_forget. */
#ifndef PT_COMM_TICKER_H
#define PT_COMM_TICKER_H

#include "partrain/core.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

typedef void (*pt_ticker_fn)(void *arg);

typedef struct {
    pthread_mutex_t mu;
    pthread_cond_t cv; /* on CLOCK_MONOTONIC */
    pthread_t thread;
    uint64_t period_ns;
    pt_ticker_fn fn;
    void *arg;
    atomic_int running; /* kick may come from any thread */
    int stop, kicked;
} pt_ticker;

/* Start calling fn(arg) every period_ns. PT_ERR_INTERNAL (naming `what`)
 * when the thread cannot start. t must not be running. */
pt_status pt_ticker_start(pt_ticker *t, uint64_t period_ns, pt_ticker_fn fn, void *arg,
                          const char *what);
/* Run the next call now rather than at the end of the period. Any thread,
 * also fn itself; a no-op when t is not running. */
void pt_ticker_kick(pt_ticker *t);
/* Stop: wait for a call in progress, join the thread. No-op when stopped. */
void pt_ticker_stop(pt_ticker *t);
/* In a forked child: no thread to stop; make t startable again. */
void pt_ticker_forget(pt_ticker *t);

#endif
