// Command nxdns answers every DNS query on a UDP address with NXDOMAIN ("no such host").
// run.sh starts it on 127.0.0.1:53 inside the suite's private network namespace, where
// /etc/resolv.conf points at it, so that TestFailedDNSLookupProxy_HTTPCONN's lookup of
// thisdefinitelydoesnotexist.com fails the way a real resolver makes it fail, without
// leaving loopback.
//
//	nxdns [-listen 127.0.0.1:53] [-ready FILE]
package main

import (
	"flag"
	"log"
	"net"
	"os"

	"golang.org/x/net/dns/dnsmessage"
)

func main() {
	listen := flag.String("listen", "127.0.0.1:53", "UDP address to answer on")
	ready := flag.String("ready", "", "file to create once listening")
	flag.Parse()

	conn, err := net.ListenPacket("udp", *listen)
	if err != nil {
		log.Fatalf("nxdns: %v", err)
	}
	if *ready != "" {
		if err := os.WriteFile(*ready, nil, 0o644); err != nil {
			log.Fatalf("nxdns: %v", err)
		}
	}
	buf := make([]byte, 65535)
	for {
		n, addr, err := conn.ReadFrom(buf)
		if err != nil {
			log.Fatalf("nxdns: %v", err)
		}
		var p dnsmessage.Parser
		h, err := p.Start(buf[:n])
		if err != nil || h.Response {
			continue
		}
		questions, err := p.AllQuestions()
		if err != nil {
			continue
		}
		// Same ID and questions (resolvers check both), no answers, RCODE 3.
		reply := dnsmessage.Message{
			Header: dnsmessage.Header{
				ID:                 h.ID,
				Response:           true,
				OpCode:             h.OpCode,
				Authoritative:      true,
				RecursionDesired:   h.RecursionDesired,
				RecursionAvailable: true,
				RCode:              dnsmessage.RCodeNameError,
			},
			Questions: questions,
		}
		out, err := reply.Pack()
		if err != nil {
			continue
		}
		_, _ = conn.WriteTo(out, addr)
	}
}
