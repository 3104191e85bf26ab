package algo

// Constructors for steps and refs, shared by the schedule generators so that
// every step sets exactly the fields its primitive uses (unused peers -1).

// InBlock names block b of the send buffer.
func InBlock(b int) Ref { return Ref{Buf: In, Block: b} }

// OutBlock names block b of the receive buffer.
func OutBlock(b int) Ref { return Ref{Buf: Out, Block: b} }

// TmpBlock names block b of the executor's per-chunk scratch buffer.
func TmpBlock(b int) Ref { return Ref{Buf: Tmp, Block: b} }

// SendStep sends src to peer to.
func SendStep(to int, src Ref) Step {
	return Step{Prim: Send, SendPeer: to, RecvPeer: -1, Src: src}
}

// RecvStep receives from peer from into dst.
func RecvStep(from int, dst Ref) Step {
	return Step{Prim: Recv, SendPeer: -1, RecvPeer: from, Dst: dst}
}

// CopySendStep copies src into dst and sends it to peer to.
func CopySendStep(to int, src, dst Ref) Step {
	return Step{Prim: CopySend, SendPeer: to, RecvPeer: -1, Src: src, Dst: dst}
}

// RecvCopySendStep receives from peer from into dst and forwards it to peer to.
func RecvCopySendStep(from, to int, dst Ref) Step {
	return Step{Prim: RecvCopySend, SendPeer: to, RecvPeer: from, Dst: dst}
}

// RecvReduceSendStep reduces a message from peer from with src and sends the
// result to peer to.
func RecvReduceSendStep(from, to int, src Ref) Step {
	return Step{Prim: RecvReduceSend, SendPeer: to, RecvPeer: from, Src: src}
}

// RecvReduceCopyStep reduces a message from peer from with src into dst.
func RecvReduceCopyStep(from int, src, dst Ref) Step {
	return Step{Prim: RecvReduceCopy, SendPeer: -1, RecvPeer: from, Src: src, Dst: dst}
}

// RecvReduceCopySendStep reduces a message from peer from with src into dst
// and sends the result to peer to.
func RecvReduceCopySendStep(from, to int, src, dst Ref) Step {
	return Step{Prim: RecvReduceCopySend, SendPeer: to, RecvPeer: from, Src: src, Dst: dst}
}

// CopyStep copies src into dst locally.
func CopyStep(src, dst Ref) Step {
	return Step{Prim: Copy, SendPeer: -1, RecvPeer: -1, Src: src, Dst: dst}
}

// SendRecvStep sends src to peer to and receives from peer from into dst.
func SendRecvStep(to int, src Ref, from int, dst Ref) Step {
	return Step{Prim: SendRecv, SendPeer: to, RecvPeer: from, Src: src, Dst: dst}
}

// LocalReduceStep reduces src into dst locally (dst = src op dst).
func LocalReduceStep(src, dst Ref) Step {
	return Step{Prim: LocalReduce, SendPeer: -1, RecvPeer: -1, Src: src, Dst: dst}
}

// AsSrcFirst returns s with SrcFirst set: its reduction is Src op msg.
func (s Step) AsSrcFirst() Step {
	s.SrcFirst = true
	return s
}

// AsFinal returns s with Final set: the step produces the complete reduction
// of its block.
func (s Step) AsFinal() Step {
	s.Final = true
	return s
}
