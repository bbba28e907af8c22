#!/bin/sh
# Run inside the debootstrapped root (chroot) before `docker import`: what every quire-ci
# image needs of its base. Packages' maintainer scripts must not start daemons in a build.
set -eu
printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d
chmod 755 /usr/sbin/policy-rc.d
printf 'APT::Install-Recommends "false";\nAPT::Install-Suggests "false";\n' > /etc/apt/apt.conf.d/90quire-no-recommends
apt-get clean
rm -rf /var/lib/apt/lists/* /var/cache/apt/*.bin /tmp/* /var/log/*.log
