package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// zkInstallHint is what lockbench prints when it cannot find ZooKeeper.
const zkInstallHint = "install it with `apt-get install zookeeper` (Debian/Ubuntu: ZooKeeper 3.8 and a JRE), or point --zk-classpath at the jars of a ZooKeeper release (e.g. \"/opt/zookeeper/lib/*\")"

// zkInstall is a ZooKeeper server the bench can start: a java binary and a
// classpath holding org.apache.zookeeper.server.quorum.QuorumPeerMain.
type zkInstall struct {
	java      string
	classpath string
}

// debianZKJar is where Debian's libzookeeper-java puts the server; its
// manifest's Class-Path names the dependencies in /usr/share/java, so the
// one jar is the whole classpath.
const debianZKJar = "/usr/share/java/zookeeper.jar"

// findZooKeeper looks for java and ZooKeeper's jars. classpath overrides
// the Debian location. The error says what is missing and how to install it.
func findZooKeeper(classpath string) (*zkInstall, error) {
	java, err := exec.LookPath("java")
	if err != nil {
		return nil, fmt.Errorf("no java in PATH; %s", zkInstallHint)
	}
	if classpath == "" {
		if _, err := os.Stat(debianZKJar); err != nil {
			return nil, fmt.Errorf("no %s; %s", debianZKJar, zkInstallHint)
		}
		classpath = debianZKJar
		// Without an SLF4J binding the server logs nothing at all; with
		// slf4j-simple (Debian's libslf4j-java, a dependency of zookeeper)
		// its warnings and errors reach the member's log.
		if _, err := os.Stat("/usr/share/java/slf4j-simple.jar"); err == nil {
			classpath += ":/usr/share/java/slf4j-simple.jar"
		}
	}
	return &zkInstall{java: java, classpath: classpath}, nil
}

type zkMember struct {
	id                       int
	clientAddr               string // 127.0.0.1:port
	quorumPort, electionPort int
	dir                      string
	p                        *proc
}

// zkCluster is N ZooKeeper servers, one JVM each, on loopback.
type zkCluster struct {
	dir     string
	heap    string
	members []*zkMember
	version string // from the leader's srvr
}

// zooCfg is one member's configuration. forceSync=yes (ZooKeeper's default,
// written out so the comparison's fsync policy is explicit): every
// transaction log write is fsynced before the server acknowledges it, as
// lockd's and etcd's are. maxClientCnxns=0 lifts the default cap of 60
// connections per client IP (all the bench's clients come from 127.0.0.1).
// The admin server (an HTTP server on :8080 by default) is off; the srvr
// four-letter word tells the bench who leads.
func zooCfg(dataDir string, clientPort int, servers []string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "tickTime=2000\ninitLimit=10\nsyncLimit=5\n")
	fmt.Fprintf(&b, "dataDir=%s\nclientPort=%d\nclientPortAddress=127.0.0.1\n", dataDir, clientPort)
	fmt.Fprintf(&b, "forceSync=yes\nmaxClientCnxns=0\nadmin.enableServer=false\n4lw.commands.whitelist=srvr,ruok\n")
	for _, s := range servers {
		b.WriteString(s + "\n")
	}
	return b.String()
}

// startZooKeeper writes a data dir, myid and zoo.cfg per member and starts
// each member's JVM directly (java -cp ... QuorumPeerMain zoo.cfg) in its own
// process group, then waits until one member leads and the others follow.
func startZooKeeper(ctx context.Context, inst *zkInstall, dir string, n int, heap string) (*zkCluster, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	c := &zkCluster{dir: dir, heap: heap}
	var servers []string
	for i := 1; i <= n; i++ {
		var ports [3]int
		for j := range ports {
			p, err := freePort()
			if err != nil {
				return nil, err
			}
			ports[j] = p
		}
		m := &zkMember{
			id:           i,
			clientAddr:   fmt.Sprintf("127.0.0.1:%d", ports[0]),
			quorumPort:   ports[1],
			electionPort: ports[2],
			dir:          filepath.Join(dir, fmt.Sprintf("z%d", i)),
		}
		servers = append(servers, fmt.Sprintf("server.%d=127.0.0.1:%d:%d", i, m.quorumPort, m.electionPort))
		c.members = append(c.members, m)
	}
	for _, m := range c.members {
		data := filepath.Join(m.dir, "data")
		if err := os.MkdirAll(data, 0o755); err != nil {
			return nil, err
		}
		if err := os.WriteFile(filepath.Join(data, "myid"), []byte(strconv.Itoa(m.id)+"\n"), 0o644); err != nil {
			return nil, err
		}
		_, port, _ := net.SplitHostPort(m.clientAddr)
		cp, _ := strconv.Atoi(port)
		if err := os.WriteFile(filepath.Join(m.dir, "zoo.cfg"), []byte(zooCfg(data, cp, servers)), 0o644); err != nil {
			return nil, err
		}
	}
	for _, m := range c.members {
		p, err := startProc(fmt.Sprintf("zookeeper-z%d", m.id), filepath.Join(dir, fmt.Sprintf("z%d.log", m.id)), inst.java,
			"-Xmx"+heap,
			"-Djava.net.preferIPv4Stack=true",
			"-Dzookeeper.log.dir="+m.dir,
			"-Dorg.slf4j.simpleLogger.defaultLogLevel=warn",
			"-Dorg.slf4j.simpleLogger.showDateTime=true",
			"-cp", inst.classpath,
			"org.apache.zookeeper.server.quorum.QuorumPeerMain", filepath.Join(m.dir, "zoo.cfg"))
		if err != nil {
			c.stop()
			return nil, err
		}
		m.p = p
	}
	l, err := c.waitQuorum(ctx, 90*time.Second)
	if err != nil {
		c.stop()
		return nil, err
	}
	if st, err := zkSrvr(l.clientAddr, 2*time.Second); err == nil {
		c.version = st.version
	}
	return c, nil
}

// waitQuorum waits until every member answers srvr with leader or follower.
func (c *zkCluster) waitQuorum(ctx context.Context, timeout time.Duration) (*zkMember, error) {
	deadline := time.Now().Add(timeout)
	var last error
	for time.Now().Before(deadline) {
		var leader *zkMember
		serving := 0
		for _, m := range c.members {
			if m.p != nil && m.p.exited() {
				return nil, fmt.Errorf("zookeeper z%d exited: %v\n%s", m.id, m.p.err, m.p.logTail(2000))
			}
			st, err := zkSrvr(m.clientAddr, time.Second)
			if err != nil {
				last = fmt.Errorf("z%d: %w", m.id, err)
				continue
			}
			switch st.mode {
			case "leader":
				leader = m
				serving++
			case "follower":
				serving++
			}
		}
		if leader != nil && serving == len(c.members) {
			return leader, nil
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
	return nil, errors.Join(fmt.Errorf("zookeeper: no quorum within %v", timeout), last)
}

// leader returns the member that says it leads.
func (c *zkCluster) leader(ctx context.Context) (*zkMember, error) {
	return c.waitQuorum(ctx, 30*time.Second)
}

func (c *zkCluster) stop() {
	for _, m := range c.members {
		if m.p != nil {
			m.p.stop(10 * time.Second)
		}
	}
}

func (c *zkCluster) endpoints() []string {
	var eps []string
	for _, m := range c.members {
		eps = append(eps, m.clientAddr)
	}
	return eps
}

func (c *zkCluster) pids() []int {
	var ps []int
	for _, m := range c.members {
		if m.p != nil {
			ps = append(ps, m.p.pid())
		}
	}
	return ps
}

// srvrStat is what the bench reads from the srvr four-letter word.
type srvrStat struct {
	mode    string // leader, follower, standalone
	version string
}

// zkSrvr asks one server for srvr. (go-zookeeper's FLWSrvr parses the same
// answer, but its pattern of the build date rejects some distributions'
// version lines.)
func zkSrvr(addr string, timeout time.Duration) (srvrStat, error) {
	conn, err := net.DialTimeout("tcp", addr, timeout)
	if err != nil {
		return srvrStat{}, err
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(timeout))
	if _, err := conn.Write([]byte("srvr")); err != nil {
		return srvrStat{}, err
	}
	b, err := io.ReadAll(conn)
	if err != nil {
		return srvrStat{}, err
	}
	return parseSrvr(string(b))
}

// parseSrvr reads the mode and version from a srvr answer. A server
// without a quorum answers "This ZooKeeper instance is not currently
// serving requests".
func parseSrvr(s string) (srvrStat, error) {
	var st srvrStat
	sc := bufio.NewScanner(strings.NewReader(s))
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		v = strings.TrimSpace(v)
		switch k {
		case "Mode":
			st.mode = v
		case "Zookeeper version":
			st.version, _, _ = strings.Cut(v, ",")
			// Debian's build leaves the git placeholder in:
			// "3.8.0-${mvngit.commit.id}".
			st.version, _, _ = strings.Cut(st.version, "-${")
		}
	}
	if st.mode == "" {
		return st, fmt.Errorf("not serving: %q", strings.TrimSpace(s))
	}
	return st, nil
}
