#!/bin/sh
echo "error: coverage is not supported in this offline workspace (remote_coverage_tools is a stand-in)" >&2
exit 1
