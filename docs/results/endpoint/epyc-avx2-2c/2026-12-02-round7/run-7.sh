#!/bin/bash
# Issue 15, 2026-12-02 (second session): run-6.sh repeated on the final code of the fix (the goodput controller's
# seeded verification curve, made non-decreasing, gives the shape; one median level per context bucket from the
# live steps; batched rows keep the old rule). Run 6 measured the first form (level from the nearest run width).
exec bash "$(dirname "$0")/alternate.sh" 7
