/*
 * The contract's list of loaded objects without the preload: objects.c
 * linked into a test or benchmark of the symbolizer, which runs alone.
 */
#ifndef MT_TEST_OBJECTS_API_H
#define MT_TEST_OBJECTS_API_H

#include "mtrace_api.h"
#include "objects.h"

static const struct mtrace_api objects_only = {
    .version = MTRACE_API_VERSION,
    .size = sizeof(struct mtrace_api),
    .objects = mt_objects_each,
    .object_at = mt_object_at,
    .objects_generation = mt_objects_generation,
};

#endif
