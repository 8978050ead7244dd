// emu_fiber_switch(void** save_sp, void* new_sp) for x86-64 System V, the emulator's only
// machine-specific code (emu_runtime.h): saves the callee-saved registers, mxcsr and the x87
// control word on the current stack, stores the stack pointer in *save_sp, and resumes the fiber
// whose stack pointer is new_sp (a frame of the same shape, built by this function or by
// emu::init_fiber_stack). CMakeLists.txt builds the emulator on x86-64 hosts only.
asm(R"(
  .text
  .globl emu_fiber_switch
  .type emu_fiber_switch,@function
emu_fiber_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  subq $8, %rsp
  stmxcsr (%rsp)
  fnstcw 4(%rsp)
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  ldmxcsr (%rsp)
  fldcw 4(%rsp)
  addq $8, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size emu_fiber_switch, .-emu_fiber_switch
)");
