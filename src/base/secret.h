/*
 * secret.h - memory for credentials that must not end up in a core dump.
 *
 * A secret (a secret access key, a session token) is copied into pages of
 * its own, marked MADV_DONTDUMP, and wiped when freed. main.c also makes
 * the process non-dumpable (PR_SET_DUMPABLE) before it reads credentials;
 * this covers the case where the system still dumps it (suid_dumpable).
 *
 * Threads: every function may be called from any thread.
 */
#ifndef S3CFS_SECRET_H
#define S3CFS_SECRET_H

/* A copy of TEXT in secret memory, NUL-terminated; NULL when TEXT is NULL
 * or memory ran out. */
char *secret_strdup(const char *text);

/* Wipe and free a copy made by secret_strdup(); *secret = NULL. Safe with
 * NULL and twice. */
void secret_free(char **secret);

#endif /* S3CFS_SECRET_H */
