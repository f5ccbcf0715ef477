"""What the node enforces for each lane, whatever API gave it (device plugin or DRA): the device nodes a
container gets, the lane's own directories (MPS pipe, /dev/shm) and the lane's own MPS control daemon with
its limits set server-side (docs/node-agent.md, "What a tenant can and cannot do")."""
