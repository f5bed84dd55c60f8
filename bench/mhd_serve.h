/* mhd_serve.h - the loopback server both bench S3 stand-ins run
 * (s3_sink.c, s3_mem.c): libmicrohttpd with a thread per connection on
 * 127.0.0.1:PORT (0: a free port), the port printed on stdout, serving
 * until SIGTERM or SIGINT. */
#ifndef SPOT_BENCH_MHD_SERVE_H
#define SPOT_BENCH_MHD_SERVE_H

#include <arpa/inet.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

/* 0 once stopped by a signal, 1 when it could not listen. completed may
 * be NULL. */
static inline int
mhd_serve(const char *name, unsigned port, MHD_AccessHandlerCallback handle,
          MHD_RequestCompletedCallback completed)
{
  const union MHD_DaemonInfo *info;
  struct MHD_Daemon *d;
  struct sockaddr_in sa;
  sigset_t stop;
  int sig;

  memset(&sa, 0, sizeof(sa));
  sa.sin_family = AF_INET;
  sa.sin_port = htons((uint16_t)port);
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK); /* loopback only */
  /* blocked before MHD's threads start, so they inherit it */
  sigemptyset(&stop);
  sigaddset(&stop, SIGTERM);
  sigaddset(&stop, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop, NULL);
  /* a large connection buffer: the body arrives in few, large pieces */
  d = MHD_start_daemon(
      MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD |
          MHD_USE_POLL,
      (uint16_t)port, NULL, NULL, handle, NULL, MHD_OPTION_CONNECTION_LIMIT,
      512U, MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)(1U << 20),
      MHD_OPTION_NOTIFY_COMPLETED, completed, NULL, MHD_OPTION_SOCK_ADDR,
      (struct sockaddr *)&sa, MHD_OPTION_END);
  if (d == NULL) {
    fprintf(stderr, "%s: cannot listen on port %u\n", name, port);
    return 1;
  }
  info = MHD_get_daemon_info(d, MHD_DAEMON_INFO_BIND_PORT);
  printf("%u\n", info != NULL ? (unsigned)info->port : port);
  fflush(stdout);
  sigwait(&stop, &sig);
  MHD_stop_daemon(d);
  return 0;
}

#endif
