/*
 * labkit_seats: a Slurm SPANK plug-in that puts every task of a workshop account's job in that account's own
 * world on the node (labkit/nodes/slurm_seats.py builds it; docs/workshop.md, "the security model").
 *
 * In slurm_spank_task_init_privileged (in the task, after fork, as root, before it becomes the user), for a job
 * whose user has a network namespace NETNS/PREFIX<node>-<user> on this node (made by `labkit workshop up`):
 *   - the task joins that namespace: the account's own address and loopback, reaching only its own seats on
 *     the other nodes, the Slurm daemons and the hub;
 *   - in a mount namespace of its own, /etc/hosts is HOSTS/<user> (each node's name is the account's address
 *     on that node), and /tmp, /var/tmp and /dev/shm are the job's own folders NODES/<node>/jobs/<job>/tmp and
 *     .../shm, which root's Prolog made for the job's user; and, as the user, the task enters its working folder
 *     again (one in /tmp is then the job's own).
 * A job of a user without such a namespace (root's, or an account of no workshop) is left as it is. A job of a
 * user with one that cannot be put in it does not start (fail closed).
 *
 * Arguments (plugstack.conf, written by root): netns=DIR prefix=P hosts=DIR nodes=DIR.
 * Nothing here follows a path a user controls: every folder but the last is root's, and the job's folders are
 * opened one level at a time, without following links, and must be the job user's.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pwd.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include <slurm/spank.h>

SPANK_PLUGIN(labkit_seats, 1);

static char netns_dir[512] = "/run/netns";
static char prefix[64] = "lkn-";
static char hosts_dir[512] = "";
static char nodes_dir[512] = "";
static int placed = 0;  /* this task was put in its account's world (task_init_privileged, same process) */

static int name_ok(const char *s)
{
    size_t n = strlen(s);
    if (n == 0 || n > 32 || !((s[0] >= 'a' && s[0] <= 'z') || s[0] == '_'))
        return 0;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_' || c == '-'))
            return 0;
    }
    return 1;
}

static int set_arg(const char *arg, const char *key, char *out, size_t size)
{
    size_t k = strlen(key);
    if (strncmp(arg, key, k) != 0)
        return 0;
    if (strlen(arg + k) >= size)
        return -1;
    strcpy(out, arg + k);
    return 1;
}

int slurm_spank_init(spank_t sp, int ac, char **av)
{
    (void)sp;
    for (int i = 0; i < ac; i++) {
        int got = set_arg(av[i], "netns=", netns_dir, sizeof netns_dir);
        if (!got) got = set_arg(av[i], "prefix=", prefix, sizeof prefix);
        if (!got) got = set_arg(av[i], "hosts=", hosts_dir, sizeof hosts_dir);
        if (!got) got = set_arg(av[i], "nodes=", nodes_dir, sizeof nodes_dir);
        if (got != 1) {
            slurm_error("labkit_seats: bad argument %s", av[i]);
            return -1;
        }
    }
    return 0;
}

/* The folder NODES/<node>/jobs/<job>/<sub>, opened without following links; it must be a folder of uid's. */
static int job_folder(const char *node, uint32_t job, const char *sub, uid_t uid)
{
    char job_name[16];
    snprintf(job_name, sizeof job_name, "%u", job);
    const char *parts[] = {node, "jobs", job_name, sub};
    int fd = open(nodes_dir, O_PATH | O_DIRECTORY | O_CLOEXEC);
    for (size_t i = 0; fd >= 0 && i < sizeof parts / sizeof parts[0]; i++) {
        int next = openat(fd, parts[i], O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        close(fd);
        fd = next;
    }
    struct stat st;
    if (fd >= 0 && (fstat(fd, &st) != 0 || st.st_uid != uid)) {
        close(fd);
        errno = EPERM;
        return -1;
    }
    return fd;
}

static int bind_fd(int fd, const char *target)
{
    char source[64];
    snprintf(source, sizeof source, "/proc/self/fd/%d", fd);
    return mount(source, target, NULL, MS_BIND, NULL);
}

int slurm_spank_task_init_privileged(spank_t sp, int ac, char **av)
{
    uid_t uid;
    uint32_t job;
    char node[65] = "", user[64], path[1024], pwbuf[4096];
    struct passwd pw, *found = NULL;

    (void)ac, (void)av;
    if (!spank_remote(sp))
        return 0;
    if (spank_get_item(sp, S_JOB_UID, &uid) != ESPANK_SUCCESS || spank_get_item(sp, S_JOB_ID, &job) != ESPANK_SUCCESS)
        return 0;
    if (uid == 0 || getpwuid_r(uid, &pw, pwbuf, sizeof pwbuf, &found) != 0 || found == NULL)
        return 0;
    if (!name_ok(pw.pw_name) || gethostname(node, sizeof node - 1) != 0 || !name_ok(node))
        return 0;  /* no workshop account (labkit's names are these), or no node of labkit's */
    strcpy(user, pw.pw_name);
    if (snprintf(path, sizeof path, "%s/%s%s-%s", netns_dir, prefix, node, user) >= (int)sizeof path)
        return -1;
    int netns = open(path, O_RDONLY | O_CLOEXEC);
    if (netns < 0)
        return errno == ENOENT ? 0 : (slurm_error("labkit_seats: %s: %m", path), -1);
    int ok = setns(netns, CLONE_NEWNET);
    close(netns);
    if (ok != 0) {
        slurm_error("labkit_seats: joining %s: %m", path);
        return -1;
    }
    if (unshare(CLONE_NEWNS) != 0 || mount(NULL, "/", NULL, MS_REC | MS_SLAVE, NULL) != 0) {
        slurm_error("labkit_seats: a mount namespace for job %u: %m", job);
        return -1;
    }
    if (snprintf(path, sizeof path, "%s/%s", hosts_dir, user) >= (int)sizeof path
        || mount(path, "/etc/hosts", NULL, MS_BIND, NULL) != 0) {
        slurm_error("labkit_seats: %s on /etc/hosts: %m", path);
        return -1;
    }
    const char *subs[] = {"tmp", "tmp", "shm"};
    const char *targets[] = {"/tmp", "/var/tmp", "/dev/shm"};
    for (int i = 0; i < 3; i++) {
        int fd = job_folder(node, job, subs[i], uid);
        if (fd < 0 || bind_fd(fd, targets[i]) != 0) {
            slurm_error("labkit_seats: job %u's folder %s on %s: %m", job, subs[i], targets[i]);
            if (fd >= 0)
                close(fd);
            return -1;
        }
        close(fd);
    }
    placed = 1;
    return 0;
}

/* As the user, before exec: the task's folder entered again, so that a job started in /tmp (--chdir=/tmp, entered
 * before the folders above were mounted) works in its own /tmp, not the node's. */
int slurm_spank_task_init(spank_t sp, int ac, char **av)
{
    char cwd[4096];
    (void)sp, (void)ac, (void)av;
    if (placed && getcwd(cwd, sizeof cwd) != NULL && chdir(cwd) != 0)
        slurm_error("labkit_seats: entering %s again: %m", cwd);
    return 0;
}
