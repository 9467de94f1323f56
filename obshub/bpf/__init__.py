"""The BPF programs of the agent, as C sources (package data): ``obshub.producer.loader`` hands
``obshub.bpf/obshub.c`` and the layer files it includes to bcc, which compiles them on the node."""
