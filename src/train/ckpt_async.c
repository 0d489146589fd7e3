/* Asynchronous saves (checkpoint.async): the step copies this rank's write
 * shares into a staging buffer (pt_ckpt_pieces_stage, the only part the
 * step waits for), and a writer thread runs the collective save
 * (pt_ckpt_write) on a communicator of its own, a split of the world made
 * at the trainer's start, so that its metadata agreement and its commit
 * barrier never queue behind the training's collectives nor they behind
 * its (different communicators may be used by different threads at once:
 * docs/comm.md). One save at a time: the next save, the end of the run and
 * freeing the trainer wait for it, and its status is theirs. The bytes
 * written are those of a synchronous save of the same step (the same
 * pieces from a copy), and the directory protocol is the same, so a crash
 * at any moment leaves the previous checkpoint whole.
 *
 * The staging buffer is kept between saves (PT_MEM_SCRATCH; its first
 * touch costs page faults that a save every few steps should not pay
 * again): its size is this rank's write share, the stated bound of an
 * asynchronous save's memory (docs/parallel.md).
 *
 * Not here: the save itself (ckpt_write.c), what is staged (trainer). */
#include "ckpt_impl.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct pt_ckpt_async {
    pt_comm *comm; /* owned */
    pthread_t thread;
    int running;
    pt_ckpt_write_job job;
    void (*job_free)(void *);
    void *job_arg;
    pt_status st;
    int shared;
    char msg[1024]; /* the thread's error message (messages are per thread) */
    char *staging;
    uint64_t cap;
};

pt_status pt_ckpt_async_new(pt_ckpt_async **out, pt_comm *comm) {
    *out = calloc(1, sizeof **out);
    if (!*out) {
        pt_comm_free(comm);
        return pt_error_set(PT_ERR_NOMEM, "checkpoint.async: writer");
    }
    (*out)->comm = comm;
    return PT_OK;
}

pt_comm *pt_ckpt_async_comm(pt_ckpt_async *a) {
    return a->comm;
}

static void *writer(void *arg) {
    pt_ckpt_async *a = arg;
    pt_error_clear();
    if (a->job.entry != PT_OK) /* the step's failure, in this thread's words */
        pt_error_set(a->job.entry, "%s", a->msg);
    a->st = pt_ckpt_write(&a->job);
    snprintf(a->msg, sizeof a->msg, "%s", a->st == PT_OK ? "" : pt_error_message());
    a->shared = a->st != PT_OK && pt_error_is_shared();
    if (a->job_free) a->job_free(a->job_arg);
    return NULL;
}

pt_status pt_ckpt_async_start(pt_ckpt_async *a, const pt_ckpt_write_job *j,
                              void (*job_free)(void *), void *job_arg) {
    PT_ASSERT(!a->running);
    a->job = *j;
    a->job.comm = a->comm;
    a->job_free = job_free;
    a->job_arg = job_arg;
    snprintf(a->msg, sizeof a->msg, "%s", j->entry != PT_OK ? pt_error_message() : "");
    if (pthread_create(&a->thread, NULL, writer, a) != 0) {
        /* the other ranks' writers wait for this rank's: it saves here */
        PT_WARN("checkpoint.async: no writer thread; saving step %d in the step", j->step);
        writer(a);
        return pt_ckpt_async_wait(a);
    }
    a->running = 1;
    return PT_OK;
}

pt_status pt_ckpt_async_wait(pt_ckpt_async *a) {
    if (!a) return PT_OK;
    if (a->running) pthread_join(a->thread, NULL);
    a->running = 0;
    if (a->st == PT_OK) return PT_OK;
    pt_status st = pt_error_set(a->st, "%s", a->msg);
    if (a->shared) pt_error_mark_shared();
    a->st = PT_OK; /* reported once */
    return st;
}

char *pt_ckpt_async_staging(pt_ckpt_async *a, uint64_t bytes) {
    PT_ASSERT(!a->running);
    if (bytes <= a->cap && a->staging) return a->staging;
    pt_mem_free(a->staging);
    a->cap = 0;
    a->staging = pt_mem_alloc(PT_MEM_SCRATCH, bytes ? (size_t)bytes : 1);
    if (a->staging) a->cap = bytes;
    return a->staging;
}

void pt_ckpt_async_free(pt_ckpt_async *a) {
    if (!a) return;
    if (pt_ckpt_async_wait(a) != PT_OK) PT_WARN("checkpoint.async: %s", pt_error_message());
    pt_mem_free(a->staging);
    pt_comm_free(a->comm);
    free(a);
}
