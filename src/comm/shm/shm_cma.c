/* Single-copy transfers between the private memory of two ranks (Linux
 * cross-memory attach, process_vm_readv/writev, Linux 3.2+): the kernel
 * copies straight from one process's pages into the other's, so a byte moves
 * once instead of twice through the shared arena. Allowed between processes
 * of the same user unless a policy forbids it (Yama ptrace_scope >= 1 for
 * non-descendants, seccomp in some containers, PR_SET_DUMPABLE 0): callers
 * probe first and fall back to the staged algorithms (shm.c).
 *
 * Not here: when to use it and the collectives built on it (shm.c). */
#include "shm.h"

#include <errno.h>
#include <sys/uio.h>

/* The kernel may move fewer bytes than asked (it stops at the first page it
 * cannot pin); continue from there. */
static int cma_move(int pid, char *local, char *remote, size_t bytes, int write) {
    while (bytes > 0) {
        struct iovec l = {local, bytes}, r = {remote, bytes};
        ssize_t got = write ? process_vm_writev(pid, &l, 1, &r, 1, 0)
                            : process_vm_readv(pid, &l, 1, &r, 1, 0);
        if (got < 0) {
            if (errno == EINTR) continue;
            return errno;
        }
        if (got == 0) return EFAULT;
        local += got;
        remote += got;
        bytes -= (size_t)got;
    }
    return 0;
}

int pt_shm_cma_read(int pid, void *dst, const void *remote, size_t bytes) {
    return cma_move(pid, dst, (char *)remote, bytes, 0);
}

int pt_shm_cma_write(int pid, const void *src, void *remote, size_t bytes) {
    return cma_move(pid, (char *)src, remote, bytes, 1);
}
