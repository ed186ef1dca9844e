/*
 * warm_report.c - the text of `s3cachefs warm` (see warm_report.h).
 */
#include "config.h"

#include "cmd/warm_report.h"

#include <inttypes.h>
#include <string.h>

static const char *const mode_names[] = {
    [WARM_MODE_FETCH] = "warm",
    [WARM_MODE_CHECK] = "check",
    [WARM_MODE_EVICT] = "evict",
    [WARM_MODE_PIN] = "pin",
    [WARM_MODE_UNPIN] = "unpin",
};

const char *warm_report_mode_name(enum warm_mode mode)
{
    return (unsigned)mode < sizeof(mode_names) / sizeof(mode_names[0])
               ? mode_names[mode] : "warm";
}

char *warm_report_list_line(char *line)
{
    size_t len = strlen(line);

    while (len > 0 && (line[len - 1] == '\r' || line[len - 1] == '\n' ||
                       line[len - 1] == ' ' || line[len - 1] == '\t'))
        line[--len] = '\0';
    while (*line == ' ' || *line == '\t')
        line++;
    if (*line == '\0' || *line == '#')
        return NULL;
    return line;
}

void warm_report_format_bytes(uint64_t bytes, char *buf, size_t cap)
{
    static const char *const units[] = {"KiB", "MiB", "GiB", "TiB", "PiB"};

    if (bytes < 1024) {
        snprintf(buf, cap, "%" PRIu64 " B", bytes);
        return;
    }
    double value = (double)bytes / 1024;
    unsigned unit = 0;
    while (value >= 1024 && unit + 1 < sizeof(units) / sizeof(units[0])) {
        value /= 1024;
        unit++;
    }
    snprintf(buf, cap, value < 9.95 ? "%.1f %s" : "%.0f %s", value, units[unit]);
}

void warm_report_format_duration(double seconds, char *buf, size_t cap)
{
    uint64_t whole = seconds > 0 && seconds < 1e12 ? (uint64_t)seconds : 0;

    if (whole >= 3600)
        snprintf(buf, cap, "%" PRIu64 ":%02u:%02u", whole / 3600,
                 (unsigned)(whole / 60 % 60), (unsigned)(whole % 60));
    else
        snprintf(buf, cap, "%u:%02u", (unsigned)(whole / 60),
                 (unsigned)(whole % 60));
}

unsigned warm_report_percent(uint64_t part, uint64_t whole)
{
    if (whole == 0 || part >= whole)
        return 100;
    return (unsigned)((unsigned __int128)part * 100 / whole);
}

void warm_report_progress_line(enum warm_mode mode, const struct warm_totals *totals,
                               double seconds, unsigned width, char *buf, size_t cap)
{
    char done[32], all[32], rate[48] = "", eta[48] = "", bar[32];
    unsigned percent = warm_report_percent(totals->bytes_done, totals->bytes);
    const unsigned bar_width = 20;

    for (unsigned i = 0; i < bar_width; i++)
        bar[i] = i < percent * bar_width / 100 ? '#' : ' ';
    bar[bar_width] = '\0';
    warm_report_format_bytes(totals->bytes_done, done, sizeof(done));
    warm_report_format_bytes(totals->bytes, all, sizeof(all));
    if (seconds > 0.5 && totals->bytes_done > 0) {
        double per_second = (double)totals->bytes_done / seconds;
        char speed[32], left[32];
        warm_report_format_bytes((uint64_t)per_second, speed, sizeof(speed));
        snprintf(rate, sizeof(rate), "  %s/s", speed);
        uint64_t remaining = totals->bytes > totals->bytes_done
                                 ? totals->bytes - totals->bytes_done : 0;
        warm_report_format_duration((double)remaining / per_second, left, sizeof(left));
        snprintf(eta, sizeof(eta), "  ETA %s", left);
    }
    snprintf(buf, cap, "%-5s [%s] %" PRIu64 "/%" PRIu64 " files  %s/%s%s%s%s",
             warm_report_mode_name(mode), bar, totals->done, totals->files, done, all,
             rate, eta, totals->failed > 0 ? "  (failures)" : "");
    if (width > 0 && strlen(buf) > width && width < cap)
        buf[width] = '\0';
}

void warm_report_summary_line(enum warm_mode mode, const struct warm_totals *totals,
                              double seconds, bool interrupted, char *buf, size_t cap)
{
    char size[32], fetched[32], already[32], rate[32], cached[32], freed[32];
    size_t used = 0;

    warm_report_format_bytes(totals->bytes, size, sizeof(size));
    warm_report_format_bytes(totals->fetched, fetched, sizeof(fetched));
    warm_report_format_bytes(totals->before, already, sizeof(already));
    warm_report_format_bytes(totals->cached, cached, sizeof(cached));
    warm_report_format_bytes(totals->freed, freed, sizeof(freed));
    warm_report_format_bytes(seconds > 0 ? (uint64_t)((double)totals->fetched / seconds)
                                  : 0, rate, sizeof(rate));
    const char *files_word = totals->files == 1 ? "file" : "files";
    switch (mode) {
    case WARM_MODE_FETCH:
    case WARM_MODE_PIN:
        used = (size_t)snprintf(buf, cap, "%s: %" PRIu64 " %s%s, %s: %s fetched, "
                                "%s already cached, %.1f s, %s/s, %" PRIu64
                                " failed", warm_report_mode_name(mode), totals->files,
                                files_word, mode == WARM_MODE_PIN ? " pinned" : "",
                                size, fetched, already, seconds, rate,
                                totals->failed);
        break;
    case WARM_MODE_CHECK:
        used = (size_t)snprintf(buf, cap, "check: %" PRIu64 " %s, %s, %s cached "
                                "(%u%%), %" PRIu64 " failed", totals->files,
                                files_word, size, cached,
                                warm_report_percent(totals->cached, totals->bytes),
                                totals->failed);
        break;
    case WARM_MODE_EVICT:
        used = (size_t)snprintf(buf, cap, "evict: %" PRIu64 " %s, %s freed, %"
                                PRIu64 " failed", totals->files, files_word,
                                freed, totals->failed);
        break;
    case WARM_MODE_UNPIN:
        used = (size_t)snprintf(buf, cap, "unpin: %" PRIu64 " %s unpinned, %s, %"
                                PRIu64 " failed", totals->files, files_word, size,
                                totals->failed);
        break;
    }
    if (used < cap && totals->staged > 0)
        used += (size_t)snprintf(buf + used, cap - used, ", %" PRIu64
                                 " staged (not uploaded yet: left alone)",
                                 totals->staged);
    if (used < cap && interrupted)
        used += (size_t)snprintf(buf + used, cap - used, ", interrupted");
    if (used < cap && (mode == WARM_MODE_PIN || mode == WARM_MODE_UNPIN) &&
        totals->pin_max > 0) {
        char pinned[32], allowed[32];
        warm_report_format_bytes(totals->pin_used, pinned, sizeof(pinned));
        warm_report_format_bytes(totals->pin_max, allowed, sizeof(allowed));
        snprintf(buf + used, cap - used, "; pinned now: %s of %s allowed",
                 pinned, allowed);
    }
}

/* The length of the UTF-8 sequence at TEXT, or 0 when it is not one. */
static size_t utf8_length(const unsigned char *text)
{
    size_t len = text[0] < 0x80 ? 1 : (text[0] & 0xe0) == 0xc0 ? 2
                                   : (text[0] & 0xf0) == 0xe0 ? 3
                                   : (text[0] & 0xf8) == 0xf0 ? 4 : 0;
    if (len == 2 && text[0] < 0xc2)
        return 0; /* overlong */
    for (size_t i = 1; i < len; i++)
        if ((text[i] & 0xc0) != 0x80)
            return 0;
    return len;
}

void warm_report_json_string(FILE *out, const char *text)
{
    const unsigned char *at = (const unsigned char *)text;

    fputc('"', out);
    while (*at != '\0') {
        if (*at == '"' || *at == '\\') {
            fprintf(out, "\\%c", *at++);
        } else if (*at < 0x20) {
            fprintf(out, "\\u%04x", *at++);
        } else {
            size_t len = utf8_length(at);
            if (len == 0) {
                fputs("\\ufffd", out);
                at++;
            } else {
                fwrite(at, 1, len, out);
                at += len;
            }
        }
    }
    fputc('"', out);
}
