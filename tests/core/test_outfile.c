/* Output files (core/file.c): the checks every command runs on its output
 * paths, and pt_out, the atomic writer every file goes through: the file
 * replaced whole (mode kept, a symbolic link kept and its file replaced),
 * or on any failure left as it was with no temporary beside it and one
 * message naming it with the reason (EFBIG under a file size limit, kept
 * through stdio's buffering). alarm(): a check that opened a FIFO would
 * block; the test fails instead of hanging. */
#include "partrain/core.h"
#include "pt_test.h"

#include <dirent.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

static char dir[] = "/tmp/pt-test-out-XXXXXX";

static const char *at(const char *name) {
    static char buf[4][128];
    static int k;
    k = (k + 1) % 4;
    snprintf(buf[k], sizeof buf[k], "%s/%s", dir, name);
    return buf[k];
}

static int has(const char *s) {
    return strstr(pt_error_message(), s) != NULL;
}

static void put(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    CHECK(f != NULL);
    if (f) fputs(text, f), fclose(f);
}

static int same(const char *path, const char *text) {
    char buf[64] = {0};
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    return n == strlen(text) && !memcmp(buf, text, n);
}

/* Entries of dir whose name holds "tmp": what a writer left behind. */
static int temporaries(void) {
    DIR *d = opendir(dir);
    int n = 0;
    for (struct dirent *e; d && (e = readdir(d));) n += strstr(e->d_name, "tmp") != NULL;
    if (d) closedir(d);
    return n;
}

static void test_checks(void) {
    CHECK(mkfifo(at("fifo"), 0644) == 0 && mkdir(at("sub"), 0755) == 0);
    put(at("file"), "x");
    int s = socket(AF_UNIX, SOCK_STREAM, 0);
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    snprintf(a.sun_path, sizeof a.sun_path, "%s", at("sock"));
    CHECK(s >= 0 && bind(s, (struct sockaddr *)&a, sizeof a) == 0);
    CHECK_OK(pt_file_check_output(at("new"), 0));
    CHECK_OK(pt_file_check_output(at("file"), 0));
    const char *kinds[][2] = {{"fifo", "is a FIFO, not a regular file"},
                              {"sub", "is a directory, not a regular file"},
                              {"sock", "is a socket, not a regular file"}};
    for (int i = 0; i < 3; i++) {
        CHECK_EQ(pt_file_check_output(at(kinds[i][0]), 0), PT_ERR_IO);
        CHECK(has(at(kinds[i][0])) && has(kinds[i][1]));
        FILE *f = (FILE *)1;
        CHECK_EQ(pt_file_open_output(at(kinds[i][0]), 1, &f), PT_ERR_IO);
        CHECK(f == NULL && has(kinds[i][1]));
    }
    CHECK_EQ(pt_file_check_output("/dev/null", 0), PT_ERR_IO);
    CHECK(has("is a character device"));
    /* folders: missing (strict, or made by the writer), a file in the way */
    CHECK_EQ(pt_file_check_output(at("nope/x"), 0), PT_ERR_IO);
    CHECK(has("folder") && has("nope does not exist"));
    CHECK_OK(pt_file_check_output(at("nope/deeper/x"), 1));
    CHECK_EQ(pt_file_check_output(at("file/x/y"), 1), PT_ERR_IO);
    CHECK(has("Not a directory (") && has("file is a regular file)"));
    CHECK_EQ(pt_file_check_output(at("sub/"), 0), PT_ERR_INVALID);
    /* an output directory */
    CHECK_OK(pt_dir_check_output(at("sub")));
    CHECK_OK(pt_dir_check_output(at("nope/ck")));
    CHECK_EQ(pt_dir_check_output(at("file")), PT_ERR_IO);
    CHECK(has("is a regular file, not a directory"));
    CHECK_EQ(pt_dir_check_output(at("fifo")), PT_ERR_IO);
    CHECK(has("is a FIFO, not a directory"));
    CHECK_EQ(pt_dir_check_output(at("file/ck")), PT_ERR_IO);
    CHECK(has("Not a directory"));
    /* nothing was made, nothing replaced */
    struct stat sb;
    CHECK(stat(at("nope"), &sb) != 0 && stat(at("fifo"), &sb) == 0 && S_ISFIFO(sb.st_mode));
    close(s);
    unlink(at("sock"));
}

static void test_atomic(void) {
    put(at("p.json"), "old");
    CHECK(chmod(at("p.json"), 0600) == 0);
    CHECK_OK(pt_file_write_atomic(at("p.json"), "new", 3));
    struct stat sb;
    CHECK(same(at("p.json"), "new") && stat(at("p.json"), &sb) == 0);
    CHECK_EQ(sb.st_mode & 0777, 0600);
    /* through a link: the link stays, its file is replaced */
    CHECK(symlink("p.json", at("link")) == 0);
    CHECK_OK(pt_file_write_atomic(at("link"), "linked", 6));
    CHECK(lstat(at("link"), &sb) == 0 && S_ISLNK(sb.st_mode) && same(at("p.json"), "linked"));
    /* abort: nothing written */
    pt_out *o = NULL;
    CHECK_OK(pt_out_open(&o, at("p.json")));
    if (o) fputs("half", pt_out_stream(o));
    pt_out_abort(o);
    pt_out_abort(NULL);
    CHECK(same(at("p.json"), "linked"));
    CHECK_EQ(temporaries(), 0);
    /* refused before a temporary is made */
    CHECK_EQ(pt_out_open(&o, at("fifo")), PT_ERR_IO);
    CHECK(o == NULL && has("is a FIFO"));
}

/* Over RLIMIT_FSIZE (SIGXFSZ ignored, as main.c does): the reason, EFBIG,
 * named with the file, whether the bytes went through pt_out_write or
 * through stdio calls on the stream; the old file kept, no temporary. */
static void test_file_size_limit(void) {
    static char big[16384];
    memset(big, 'x', sizeof big);
    struct rlimit old, lim;
    CHECK(getrlimit(RLIMIT_FSIZE, &old) == 0);
    lim = old;
    lim.rlim_cur = 4096;
    void (*was)(int) = signal(SIGXFSZ, SIG_IGN);
    CHECK(setrlimit(RLIMIT_FSIZE, &lim) == 0);
    pt_status st = pt_file_write_atomic(at("p.json"), big, sizeof big);
    char msg[512];
    snprintf(msg, sizeof msg, "%s", pt_error_message());
    pt_out *o = NULL;
    pt_status st2 = pt_out_open(&o, at("p.json"));
    for (int i = 0; st2 == PT_OK && i < 1000; i++) fprintf(pt_out_stream(o), "line %d\n", i);
    if (st2 == PT_OK) st2 = pt_out_commit(o);
    CHECK(setrlimit(RLIMIT_FSIZE, &old) == 0);
    signal(SIGXFSZ, was);
    CHECK_EQ(st, PT_ERR_IO);
    CHECK(strstr(msg, at("p.json")) && strstr(msg, "File too large") && !strchr(msg, '\n'));
    CHECK_EQ(st2, PT_ERR_IO);
    CHECK(has(at("p.json")) && has("write failed: File too large"));
    CHECK(same(at("p.json"), "linked"));
    CHECK_EQ(temporaries(), 0);
}

int main(void) {
    CHECK(mkdtemp(dir) != NULL);
    alarm(20);
    RUN(test_checks);
    RUN(test_atomic);
    RUN(test_file_size_limit);
    alarm(0);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    CHECK(system(cmd) == 0);
    return TEST_DONE();
}
