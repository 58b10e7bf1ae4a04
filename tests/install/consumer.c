/* A program built against an installed tdist, as a user would build it. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <tdist/tdist.h>

int main(void)
{
    tdist_store_t *s = NULL;
    if (tdist_store_hash_create(NULL, &s) != TDIST_OK) return 1;
    int64_t v = 0;
    if (tdist_store_add(s, "k", 41, NULL) != TDIST_OK || tdist_store_add(s, "k", 1, &v) != TDIST_OK)
        return 2;
    tdist_store_destroy(s);
    float a = 1.5f, b = 2.25f, c = 0;
    if (tdist_reduce(&c, &a, &b, 1, TDIST_F32, TDIST_SUM) != TDIST_OK) return 3;
    printf("tdist %s: add=%lld sum=%g bad=%s\n", tdist_version(), (long long)v, c,
           tdist_status_str(TDIST_ERR_INVALID_ARG));
    return v == 42 && c == 3.75f && strcmp(tdist_version(), TDIST_VERSION_STRING) == 0 ? 0 : 4;
}
