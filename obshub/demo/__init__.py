"""``obshub demo``: a simulated multi-host training cluster on one machine (network namespaces, a bridge,
cgroups), real faults injected into one host, and a verdict on whether obshub named the right host and
layer. Modules: ``cluster`` (namespaces, bridge, cgroups, processes, cleanup), ``faults`` (net-slow,
net-loss, cpu, mem, none), ``webhook`` (local Slack/PagerDuty receiver), ``verdict`` (scoring alerts),
``runner`` (starts every part and watches), ``cli`` (the click command)."""
