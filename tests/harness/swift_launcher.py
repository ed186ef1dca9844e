#!/usr/bin/python3
"""Runs one OpenStack Swift WSGI server for the test harness (servers.py).

The stock swift-*-server scripts always read /etc/swift/swift.conf; this
launcher points Swift at the harness's own swift.conf before any Swift module
that reads it is imported, and sends the server's log to stderr instead of
syslog.

Usage: swift_launcher.py SWIFT_DIR CONF_FILE APP_SECTION
  SWIFT_DIR    directory holding swift.conf and the rings
  CONF_FILE    paste.deploy config of the server
  APP_SECTION  account-server, container-server, object-server or proxy-server
"""
import logging
import sys

from swift.common import utils


class NoSyslogHandler(logging.NullHandler):
    """Stands in for Swift's syslog handler: without /dev/log it would send
    UDP datagrams to localhost:514. The console handler keeps the log."""

    def __init__(self, *args, **kwargs):
        super().__init__()


def main():
    swift_dir, conf_file, app_section = sys.argv[1:]
    # Must happen before swift.common.constraints and storage_policy are
    # imported: they read swift.conf once, at import time.
    utils.set_swift_dir(swift_dir)
    utils.ThreadSafeSysLogHandler = NoSyslogHandler

    from swift.common.wsgi import run_wsgi

    options = {'verbose': True}  # log to stderr, which the harness captures
    if app_section == 'object-server':
        from swift.obj import server
        options['global_conf_callback'] = server.global_conf_callback
    return run_wsgi(conf_file, app_section, **options)


if __name__ == '__main__':
    sys.exit(main())
