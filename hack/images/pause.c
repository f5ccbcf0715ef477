/* The pod sandbox's "pause" process for the test node's containerd (hack/images.sh builds it statically).
 * It holds the pod's namespaces open: it sleeps until SIGINT or SIGTERM and then exits 0. As PID 1 of the
 * pod's PID namespace (shareProcessNamespace) it also reaps the zombies re-parented to it. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

static void on_stop(int sig) {
    (void)sig;
    _exit(0);
}

static void on_child(int sig) {
    (void)sig;
    while (waitpid(-1, NULL, WNOHANG) > 0) {
    }
}

int main(int argc, char **argv) {
    struct sigaction stop = {.sa_handler = on_stop};
    struct sigaction child = {.sa_handler = on_child, .sa_flags = SA_NOCLDSTOP | SA_RESTART};
    if (argc > 1) {
        fprintf(stderr, "usage: %s (no arguments: sleeps until SIGINT or SIGTERM)\n", argv[0]);
        return 2;
    }
    if (sigaction(SIGINT, &stop, NULL) < 0 || sigaction(SIGTERM, &stop, NULL) < 0 ||
        sigaction(SIGCHLD, &child, NULL) < 0) {
        perror("pause: sigaction");
        return 1;
    }
    for (;;) {
        pause();
    }
}
