/*
 * tdist/tdist.h — everything tdist offers, in one include.
 *
 *   core.h   status codes, errors, logging, dtypes, reduction kernels
 *   store.h  key-value store (TCP, file, in-process, prefix)
 *   init.h   init methods (env://, tcp://, file://) and rendezvous
 *   pg.h     process groups, collectives, work handles
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

#endif /* TDIST_TDIST_H */
