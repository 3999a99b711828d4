#!/bin/sh
# Provision the course image from inside its root file system, as root: the non-root user, the
# project's Python environment from a folder of wheels, Horovod, the start-up hook, Fashion-MNIST in
# the user's Keras cache, ssh for MPI launchers. Run by `labkit image build` (inside the mmdebstrap
# root file system) and by the Containerfile. Usage: provision.sh FOLDER, a folder holding the Horovod
# wheel, and with requirements.txt and its wheels for an install without the package index.
set -eu
ROOT=/opt/labkit
WHEELS="${1:?usage: provision.sh WHEELHOUSE}"
USER_NAME=labkit
export PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1

id -u "$USER_NAME" >/dev/null 2>&1 || useradd --create-home --uid 1000 --shell /bin/bash "$USER_NAME"

python3 -m venv "$ROOT/.venv"
PY="$ROOT/.venv/bin/python"
if [ -f "$WHEELS/requirements.txt" ]; then
  # labkit image build: the exact versions of the project's environment, from wheels fetched beforehand.
  export PIP_NO_INDEX=1 PIP_FIND_LINKS="$WHEELS"
  "$PY" -m pip install -q -r "$WHEELS/requirements.txt"
  "$PY" -m pip install -q --no-deps -e "$ROOT"
else
  # The Containerfile: the versions pyproject.toml allows, from the package index.
  "$PY" -m pip install -q -e "$ROOT"
fi
"$PY" -m pip install -q "$WHEELS"/horovod-*.whl
"$PY" -c 'from labkit.core import env; print("start-up hook:", env.install_pth())'
# Ranks started over ssh (PATH without the environment) find it: a wrapper, not a link, since Python finds
# its environment from the path it was started by.
printf '#!/bin/sh\nexec %s/.venv/bin/python "$@"\n' "$ROOT" > /usr/local/bin/python
chmod 755 /usr/local/bin/python
ln -sf "$ROOT/.venv/bin/labkit" /usr/local/bin/labkit
ln -sf "$ROOT/.venv/bin/horovodrun" /usr/local/bin/horovodrun
"$PY" -c 'import horovod.tensorflow as hvd; assert hvd.mpi_built() and hvd.gloo_built(), "Horovod lacks MPI or Gloo"'

# Containers have no ptrace between ranks: shared memory without CMA.
echo "btl_vader_single_copy_mechanism = none" >> /etc/openmpi/openmpi-mca-params.conf

# Fashion-MNIST in the user's Keras cache (from Debian's dataset-fashion-mnist: no download).
runuser -u "$USER_NAME" -- "$ROOT/.venv/bin/labkit" data --fill-cache

# ssh between the job's containers, as the image's user (services run the image's USER): an ssh server on
# port 2222 whose settings and host key live in /etc/labkit-ssh, so that a key pair mounted over ~/.ssh (the
# Kubeflow MPI operator's) works too, and a key made for the image in ~/.ssh (the job's private network only).
HOME_DIR="$(getent passwd "$USER_NAME" | cut -d: -f6)"
SSH_DIR="$HOME_DIR/.ssh"
CONF=/etc/labkit-ssh
install -d -m 700 -o "$USER_NAME" -g "$USER_NAME" "$SSH_DIR" "$CONF"
[ -f "$SSH_DIR/id_ed25519" ] || runuser -u "$USER_NAME" -- ssh-keygen -q -t ed25519 -N "" -f "$SSH_DIR/id_ed25519"
[ -f "$CONF/host_ed25519" ] || runuser -u "$USER_NAME" -- ssh-keygen -q -t ed25519 -N "" -f "$CONF/host_ed25519"
cp "$SSH_DIR/id_ed25519.pub" "$SSH_DIR/authorized_keys"
printf 'Port 2222\nHostKey %s/host_ed25519\nPidFile /tmp/labkit-sshd.pid\nAuthorizedKeysFile .ssh/authorized_keys\nPasswordAuthentication no\nKbdInteractiveAuthentication no\nUsePAM no\n' \
  "$CONF" > "$CONF/sshd_config"
printf 'Host *\n  Port 2222\n  StrictHostKeyChecking no\n  UserKnownHostsFile /dev/null\n  LogLevel ERROR\n' \
  > /etc/ssh/ssh_config.d/labkit.conf
chown -R "$USER_NAME:$USER_NAME" "$SSH_DIR" "$CONF" "$ROOT"
chmod 600 "$SSH_DIR/authorized_keys" "$CONF/sshd_config"
mkdir -p /run/sshd
cat > /usr/local/bin/labkit-sshd <<SSHD
#!/bin/sh
# A worker machine's command for MPI launchers: the image's ssh server (port 2222) in the foreground,
# as the image's user (started by root, it drops to that user).
[ -d /run/sshd ] || mkdir -p /run/sshd 2>/dev/null || true
if [ "\$(id -u)" = 0 ]; then exec runuser -u $USER_NAME -- /usr/sbin/sshd -De -f $CONF/sshd_config "\$@"; fi
exec /usr/sbin/sshd -De -f $CONF/sshd_config "\$@"
SSHD
chmod 755 /usr/local/bin/labkit-sshd

apt-get clean
rm -rf /var/lib/apt/lists/* /root/.cache "$HOME_DIR/.cache" "$ROOT/build"
