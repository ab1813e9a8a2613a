"""etcd: the backend Protocol, its etcdctl/etcdutl implementation and the ``etcd.*`` actions.

    config = EtcdConfig(endpoints=["https://10.0.0.1:2379"], name="etcd1",
                        initial_cluster="etcd1=https://10.0.0.1:2380",
                        initial_advertise_peer_urls="https://10.0.0.1:2380")
    actions = EtcdActions(config).all()
"""
