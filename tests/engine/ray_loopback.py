"""Keep a Ray node on 127.0.0.1: run ``ray start`` (argv) or import before ``ray.init``.

Ray 2.60.0 replaces a loopback address given to ``--node-ip-address``, ``--address`` or
``ray.init(address=...)`` by the host's routable address
(``ray._private.services.resolve_ip_for_localhost``), so that other machines can reach the
node. A test cluster on one host wants the opposite: every node and driver on 127.0.0.1,
nothing on another interface. Importing this module turns that replacement off for the
process; ``python ray_loopback.py start ...`` is ``ray start ...`` with it off.
"""
import sys

import ray._private.services as services

services.resolve_ip_for_localhost = lambda host: host

if __name__ == "__main__":
    from ray.scripts.scripts import main

    sys.argv = ["ray", *sys.argv[1:]]
    main()
