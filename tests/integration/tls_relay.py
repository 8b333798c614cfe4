"""A TLS front for a plain-HTTP gateway, as a site puts one before RGW:
accepts TLS on 127.0.0.1:PORT with CERT/KEY and relays the bytes both ways to
127.0.0.1:TARGET. Host headers pass untouched, so SigV4 signatures hold.

    tls_relay.py PORT CERT KEY TARGET
"""
import socket
import ssl
import sys
import threading


def pump(a, b):
    try:
        while True:
            d = a.recv(65536)
            if not d:
                break
            b.sendall(d)
    except OSError:
        pass
    for s in (a, b):
        try:
            s.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


def serve(conn, ctx, target):
    try:
        t = ctx.wrap_socket(conn, server_side=True)
    except (OSError, ssl.SSLError):
        conn.close()
        return
    up = socket.create_connection(("127.0.0.1", target))
    threading.Thread(target=pump, args=(up, t), daemon=True).start()
    pump(t, up)


def main():
    port, cert, key, target = int(sys.argv[1]), sys.argv[2], sys.argv[3], int(sys.argv[4])
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(cert, key)
    srv = socket.create_server(("127.0.0.1", port))
    print("ready", flush=True)
    while True:
        c, _ = srv.accept()
        threading.Thread(target=serve, args=(c, ctx, target), daemon=True).start()


main()
