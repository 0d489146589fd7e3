/* The kernels' thread pool and pt_kernels_set_threads. A few persistent
 * pthreads that run one parallel loop at a time: pt_pool_run(fn, ctx, n)
 * hands worker i the call fn(ctx, i, n) and runs i = 0 itself.
 *
 * Workers spin briefly on a generation counter before sleeping on a condition
 * variable: kernels are called back to back many times per step, and waking a
 * sleeping thread costs tens of microseconds, as much as a small kernel.
 *
 * Not here: work stealing, nested parallelism, affinity. With one thread
 * (the default) no thread is ever created. */
#include <cblas.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>

#include "kernels_impl.h"

/* About 10-20 us of polling (with the pause hint) before a worker sleeps:
 * long enough to catch back-to-back kernels, short enough not to steal a
 * shared core from BLAS threads or other ranks for long. */
#define SPIN_ITERS 4000

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

static int g_threads = 1;
static int g_nworkers; /* pool threads alive (index 1..g_nworkers) */
static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_cv = PTHREAD_COND_INITIALIZER;
static atomic_long g_gen;      /* bumped once per job */
static atomic_int g_remaining; /* workers still running the current job */
static pt_pool_fn g_fn;
static void *g_ctx;
static int g_count;

static void *worker_main(void *arg) {
    int index = (int)(long)arg;
    long seen = 0;
    for (;;) {
        long gen;
        int spins = 0;
        while ((gen = atomic_load_explicit(&g_gen, memory_order_acquire)) == seen) {
            if (++spins < SPIN_ITERS) {
                cpu_relax();
                continue;
            }
            pthread_mutex_lock(&g_mu);
            while (atomic_load(&g_gen) == seen) pthread_cond_wait(&g_cv, &g_mu);
            pthread_mutex_unlock(&g_mu);
            spins = 0;
        }
        seen = gen;
        if (index < g_count) g_fn(g_ctx, index, g_count);
        atomic_fetch_sub_explicit(&g_remaining, 1, memory_order_acq_rel);
    }
    return NULL;
}

/* Start workers until there are n - 1 of them (they are never stopped:
 * extra ones stay idle, index >= count). */
static void grow_pool(int n) {
    while (g_nworkers < n - 1) {
        int idx = g_nworkers + 1;
        pthread_t tid;
        if (pthread_create(&tid, NULL, worker_main, (void *)(long)idx) != 0) break;
        pthread_detach(tid);
        g_nworkers++;
    }
}

/* After fork() only the forking thread exists in the child: forget the
 * workers (they are started again on the next parallel loop) and reset the
 * synchronization state. partrain's launcher forks ranks, possibly after the
 * parent has run kernels. */
static void after_fork_child(void) {
    g_nworkers = 0;
    atomic_store(&g_gen, 0);
    atomic_store(&g_remaining, 0);
    pthread_mutex_init(&g_mu, NULL);
    pthread_cond_init(&g_cv, NULL);
}

static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static void register_atfork(void) {
    pthread_atfork(NULL, NULL, after_fork_child);
}

void pt_kernels_set_threads(int n) {
    if (n < 1) n = 1;
    if (n > PT_KERNELS_MAX_THREADS) n = PT_KERNELS_MAX_THREADS;
    pthread_once(&g_once, register_atfork);
    g_threads = n;
    openblas_set_num_threads(n);
    grow_pool(n);
    if (g_nworkers < n - 1) g_threads = g_nworkers + 1; /* run with what we could start */
}

/* kernels.h promises one thread until told otherwise; OpenBLAS alone would
 * start with one per core. */
__attribute__((constructor)) static void default_one_thread(void) {
    openblas_set_num_threads(1);
}

int pt_kernels_threads(void) {
    return g_threads;
}

void pt_pool_run(pt_pool_fn fn, void *ctx, int n) {
    if (n > g_threads) n = g_threads;
    if (n > 1 && g_nworkers < n - 1) grow_pool(n); /* after a fork */
    if (n > g_nworkers + 1) n = g_nworkers + 1;
    if (n <= 1) {
        fn(ctx, 0, 1);
        return;
    }
    g_fn = fn;
    g_ctx = ctx;
    g_count = n;
    atomic_store(&g_remaining, g_nworkers);
    pthread_mutex_lock(&g_mu);
    atomic_fetch_add_explicit(&g_gen, 1, memory_order_release);
    pthread_cond_broadcast(&g_cv);
    pthread_mutex_unlock(&g_mu);
    fn(ctx, 0, n);
    int spins = 0;
    while (atomic_load_explicit(&g_remaining, memory_order_acquire) > 0)
        if (++spins > 1000)
            sched_yield();
        else
            cpu_relax();
}
