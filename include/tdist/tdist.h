/*
 * tdist/tdist.h — everything tdist offers, in one include.
 *
 *   core.h   status codes, errors, logging, dtypes, reduction kernels
 *   store.h  key-value store (TCP, file, in-process, prefix)
 *   init.h   init methods (env://, tcp://, file://) and rendezvous
 *   pg.h     process groups, collectives, work handles
 *   ddp.h    the DDP gradient reducer, comm hooks
 *   join.h   Join for uneven inputs
 *   optim.h  SGD, Adam, AdamW
 *   algorithms.h  comm hooks that compress, compressed collectives
 */
#ifndef TDIST_TDIST_H
#define TDIST_TDIST_H

#include "tdist/core.h"
#include "tdist/store.h"
#include "tdist/init.h"
#include "tdist/pg.h"
#include "tdist/ddp.h"
#include "tdist/join.h"
#include "tdist/optim.h"
#include "tdist/algorithms.h"

#endif /* TDIST_TDIST_H */
