#!/usr/bin/python3
"""tcpfwd.py LISTEN_HOST:PORT TARGET_HOST:PORT - a tiny TCP forwarder.

tests/slurm.sh runs it in the host namespace on the cluster bridge's
address so that node daemons in their own network namespaces reach a
service that listens on the host's loopback only (the test S3 server):
loopback is per namespace. Runs in the foreground until SIGTERM."""
import asyncio
import signal
import sys


def hostport(s):
    host, _, port = s.rpartition(":")
    return host, int(port)


async def pipe(reader, writer):
    try:
        while True:
            data = await reader.read(65536)
            if not data:
                break
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        try:
            writer.close()
        except OSError:
            pass


async def main():
    lhost, lport = hostport(sys.argv[1])
    thost, tport = hostport(sys.argv[2])

    async def handle(cr, cw):
        try:
            tr, tw = await asyncio.open_connection(thost, tport)
        except OSError:
            cw.close()
            return
        await asyncio.gather(pipe(cr, tw), pipe(tr, cw))

    server = await asyncio.start_server(handle, lhost, lport, backlog=128)
    stop = asyncio.get_running_loop().create_future()
    for s in (signal.SIGTERM, signal.SIGINT):
        asyncio.get_running_loop().add_signal_handler(s, stop.set_result, None)
    print("forwarding %s -> %s" % (sys.argv[1], sys.argv[2]), flush=True)
    async with server:
        await stop


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: tcpfwd.py LISTEN_HOST:PORT TARGET_HOST:PORT")
    asyncio.run(main())
