/* The cloud APIs of spotd-emulate next to the metadata services
 * (emulate.c): EC2 (emulate_ec2.c), Compute Engine (emulate_gce.c). Each keeps
 * its own state behind its own mutex. */
#ifndef SPOTD_EMULATE_CLOUD_H
#define SPOTD_EMULATE_CLOUD_H

#include <stdbool.h>
#include <stddef.h>

#include <microhttpd.h>

void emu_ec2_init(const char *region, const char *instance_id);
void emu_ec2_fini(void);
/* The EC2 Query API (POST /) and /__emulate/ec2/... controls. false when
 * url is not for EC2 (then *ret is untouched). */
bool emu_ec2_handle(struct MHD_Connection *c, const char *method,
                    const char *url, const char *body, size_t len,
                    enum MHD_Result *ret);
/* IMDS values of the current identity below /latest/meta-data/ (path
 * without that prefix): instance-type, placement/availability-zone,
 * instance-id, tags/instance[/KEY]. NULL: not ours (emulate.c answers). */
const char *emu_ec2_imds(const char *path, char *buf, size_t size);

void emu_gce_init(const char *region, const char *vm_name);
void emu_gce_fini(void);
/* The compute v1 API (/compute/v1/...) and /__emulate/gce/... controls. */
bool emu_gce_handle(struct MHD_Connection *c, const char *method,
                    const char *url, const char *body, size_t len,
                    enum MHD_Result *ret);
/* Metadata values below /computeMetadata/v1/ of the current identity:
 * the service account's token (JSON), instance/zone, instance/name,
 * project/project-id, instance/attributes/[KEY]. NULL: not ours. */
const char *emu_gce_meta(const char *key, char *buf, size_t size);

/* Make an instance the current identity (what the control .../boot does).
 * 0, or -ENOENT. */
int emu_ec2_boot(const char *id);
int emu_gce_boot(const char *name);

/* --boot-cmd (emulate_boot.c). clear_notice(arg) withdraws the notice of
 * the old identity. */
void emu_boot_setup(const char *cmd, double after_s, const char *url,
                    void (*clear_notice)(void *), void *arg);
/* The cloud launched an instance: boot it later when --boot-cmd is set. */
void emu_boot_launched(const char *id, bool gce);
/* SIGTERM to the booted commands, wait for them (SIGKILL after 10 s). */
void emu_boot_stop(void);

#endif
