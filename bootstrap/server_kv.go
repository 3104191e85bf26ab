package bootstrap

import (
	"bytes"
	"context"
	"strconv"
	"strings"
	"time"

	"google.golang.org/grpc/codes"

	pb "github.com/gccl/gccl/bootstrap/bootstrappb"
)

// The store wakes every blocked Get and Wait on any change (one broadcast
// channel) rather than keeping per-key waiter lists: the bootstrap store
// holds a few keys per rank and is used at init, so simplicity wins.

// kvCheckLocked is the admission check of every store call.
func (s *Server) kvCheckLocked(rank int32, keys ...string) error {
	if err := s.memberLocked(rank); err != nil {
		return err
	}
	for _, k := range keys {
		if k == "" {
			return statusError(codes.InvalidArgument, reasonInvalid, "rank %d used an empty key", rank)
		}
		if err := s.abortErrorLocked(keyGroup(k)); err != nil {
			return err
		}
	}
	return nil
}

// kvGroupSep ends the group prefix of every key a Client stores
// (Client.storeKey), so that an aborted group's keys fail with it.
const kvGroupSep = ':'

// keyGroup returns the group a key belongs to; keys written without a
// group prefix (by other clients of the protocol) count as the job's.
func keyGroup(key string) string {
	if i := strings.IndexByte(key, kvGroupSep); i > 0 {
		return key[:i]
	}
	return worldGroup
}

func (s *Server) kvChangedLocked() {
	close(s.kvChanged)
	s.kvChanged = make(chan struct{})
}

// waitForKeys blocks until every key exists (then calls found under the
// lock), the call's timeout passes, the call ends, the job aborts or the
// server stops.
func (s *Server) waitForKeys(ctx context.Context, rank int32, keys []string, timeoutMs int64, found func()) error {
	timer, stopTimer := newTimer(timeoutMs)
	defer stopTimer()
	for {
		s.mu.Lock()
		if err := s.kvCheckLocked(rank, keys...); err != nil {
			s.mu.Unlock()
			return err
		}
		var missing []string
		for _, k := range keys {
			if _, ok := s.kv[k]; !ok {
				missing = append(missing, strconvQuote(k))
			}
		}
		if len(missing) == 0 {
			found()
			s.mu.Unlock()
			return nil
		}
		changed := s.kvChanged
		s.mu.Unlock()
		if err := s.await(ctx, changed, timer); err != nil {
			if err == errWaitTimedOut {
				return statusError(codes.DeadlineExceeded, reasonTimeout,
					"rank %d waited %v for key %s; no rank has set it", rank,
					time.Duration(timeoutMs)*time.Millisecond, strings.Join(missing, ", "))
			}
			return err
		}
	}
}

func strconvQuote(k string) string {
	if len(k) > 200 {
		k = k[:200] + "..."
	}
	return strconv.Quote(k)
}

// Set stores a value.
func (s *Server) Set(_ context.Context, req *pb.SetRequest) (*pb.SetResponse, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.kvCheckLocked(req.Rank, req.Key); err != nil {
		return nil, err
	}
	s.kv[req.Key] = req.Value
	s.kvChangedLocked()
	return &pb.SetResponse{}, nil
}

// Get answers a key's value, waiting until some rank sets it.
func (s *Server) Get(ctx context.Context, req *pb.GetRequest) (*pb.GetResponse, error) {
	var value []byte
	err := s.waitForKeys(ctx, req.Rank, []string{req.Key}, req.TimeoutMs, func() { value = s.kv[req.Key] })
	if err != nil {
		return nil, err
	}
	return &pb.GetResponse{Value: value}, nil
}

// Wait answers once every key exists.
func (s *Server) Wait(ctx context.Context, req *pb.WaitRequest) (*pb.WaitResponse, error) {
	if len(req.Keys) == 0 {
		return &pb.WaitResponse{}, nil
	}
	if err := s.waitForKeys(ctx, req.Rank, req.Keys, req.TimeoutMs, func() {}); err != nil {
		return nil, err
	}
	return &pb.WaitResponse{}, nil
}

// Add adds delta to the decimal integer stored at key (a missing key counts
// as 0) and answers the sum, as TCPStore's add does.
func (s *Server) Add(_ context.Context, req *pb.AddRequest) (*pb.AddResponse, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.kvCheckLocked(req.Rank, req.Key); err != nil {
		return nil, err
	}
	var sum int64
	if old, ok := s.kv[req.Key]; ok {
		n, err := strconv.ParseInt(string(old), 10, 64)
		if err != nil {
			return nil, statusError(codes.InvalidArgument, reasonValueNotNumber,
				"rank %d: Add on key %s, which holds %s, not a decimal integer", req.Rank, strconvQuote(req.Key), strconvQuote(string(old)))
		}
		sum = n
	}
	sum += req.Delta
	s.kv[req.Key] = []byte(strconv.FormatInt(sum, 10))
	s.kvChangedLocked()
	return &pb.AddResponse{Value: sum}, nil
}

// CompareAndSet stores desired if the key holds expected (or, with
// expect_absent, does not exist).
func (s *Server) CompareAndSet(_ context.Context, req *pb.CompareAndSetRequest) (*pb.CompareAndSetResponse, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.kvCheckLocked(req.Rank, req.Key); err != nil {
		return nil, err
	}
	cur, exists := s.kv[req.Key]
	if req.ExpectAbsent == exists || (exists && !bytes.Equal(cur, req.Expected)) {
		return &pb.CompareAndSetResponse{Swapped: false}, nil
	}
	s.kv[req.Key] = req.Desired
	s.kvChangedLocked()
	return &pb.CompareAndSetResponse{Swapped: true}, nil
}

// Delete removes a key and answers whether it existed.
func (s *Server) Delete(_ context.Context, req *pb.DeleteRequest) (*pb.DeleteResponse, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.kvCheckLocked(req.Rank, req.Key); err != nil {
		return nil, err
	}
	_, existed := s.kv[req.Key]
	delete(s.kv, req.Key)
	return &pb.DeleteResponse{Existed: existed}, nil
}
