#!/bin/sh
# The Dockerfile's deps-operator and deps-worker stages: /opt/venv with one image's requirements, installed from the
# bind-mounted wheelhouse (PIP_ARGS from the build arg, e.g. --no-index), ddpjob found through a .pth file, and pip
# removed at the end (nothing installs packages at run time) with any further packages named after the list.
#   image-venv.sh REQUIREMENTS [PACKAGE_TO_REMOVE...]
set -eu
requirements=$1
shift
python3 -m venv /opt/venv
# Per command, not ENV: these settings must not reach the final images.
PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1 PIP_ROOT_USER_ACTION=ignore \
  /opt/venv/bin/pip install --find-links /tmp/build/wheelhouse ${PIP_ARGS:-} -r "$requirements"
echo /opt/ddpjob >"$(/opt/venv/bin/python -c 'import sysconfig; print(sysconfig.get_path("purelib"))')/ddpjob.pth"
/opt/venv/bin/pip uninstall -y -q pip "$@"
